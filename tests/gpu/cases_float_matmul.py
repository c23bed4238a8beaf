"""ort_mtp::MatMul on the device: the checks of the float-matmul group (csrc/float_matmul/float_matmul_cuda.cu).

Every case has fresh random A and B (values exactly representable in the element type), runs the
one-node model (B an initializer, as in the graphs) with IOBinding on device buffers, the output
poisoned with NaN first (an element the kernel leaves unwritten fails).

  1. CUDA against our CPU op: the 27B-class a/b projection (K=5120, N=48, fp16) at M = 1..16 and a
     2,048-row prefill, N not a multiple of 8 (the scalar path), K not a multiple of the block's 512
     threads, bf16 and fp32, and ctx.random_cases random ones; within TOLERANCE.
  2. Every row of the M-row call bit-identical to the 1-row call on that row, and to a call on a
     slice of rows (the kernel picks its rows per pass by M).
  3. ORT's CUDA graph: capture and replay with new A written into the bound buffer, each replay
     bit-equal to a plain run.
  4. The two-weight node MatMul(A, B, B2) -> (Y, Y2) (the merged a/b projections: the grid's first
     blocks take B, the rest B2): Y and Y2 bit-identical to one-weight CUDA nodes of B and of B2, at
     M = 1, 4 and a prefill, N2 unlike N and N % 8 != 0 in one of them (the scalar loads for both).

TOLERANCE. The CPU op sums the K products in ascending order in float32; the CUDA kernel in 512
strided partial sums combined by a tree; each is within K u_32 sum_k |a_k b_k| of the exact sum (the
recursive-summation bound), and each rounds to T once: |cuda - cpu| <= 2 K u_32 sum|a b| + 2 u_T |y|.

One record per case: {"case": label, "ok": bool, "problem": str | None, ...}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from harness import UNIT_ROUNDOFF as U, Buffer, Context  # first: it puts the checkout (driver, ops) on sys.path

from driver.device import make_session  # noqa: E402
import ops.float_matmul as fm  # noqa: E402

NODE = "/model/layers.0/linear_attn/a_proj/MatMul"


@dataclass(frozen=True)
class Case:
    k: int
    n: int
    m: int
    dtype: str = "float16"

    def label(self) -> str:
        return f"{self.dtype} K={self.k} N={self.n} M={self.m}"


FIXED = [Case(5120, 48, m) for m in (1, 2, 3, 4, 5, 8, 9, 16)] + [
    Case(5120, 48, 2048),        # a prefill chunk: passes over the grid's y extent
    Case(5120, 48, 4, "bfloat16"),
    Case(1024, 16, 7, "float32"),
    Case(1000, 17, 6),           # N % 8 != 0: the scalar loads; K % 512 != 0
    Case(37, 3, 3, "bfloat16"),
    Case(2048, 1024, 5),         # the widest N the rewrite takes
]


def random_cases(rng: np.random.Generator, n: int) -> list[Case]:
    return [Case(int(rng.integers(1, 6000)), int(rng.integers(1, 300)), int(rng.integers(1, 40)),
                 str(rng.choice(["float16", "bfloat16", "float32"]))) for _ in range(n)]


def representable(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return x


class Runner:
    def __init__(self, ctx: Context, case: Case, b: np.ndarray, graph: bool = False, cpu: bool = True):
        self.ctx, self.case = ctx, case
        model = fm.model(case.k, case.n, case.dtype, weight=b, node_name=NODE)
        self.session = make_session(ctx.device, model, graph_capture=graph)
        self.cpu_session = make_session(ctx.cpu, model) if cpu else None

    def binding(self, session, a: Buffer, y: Buffer):
        binding = session.io_binding()
        a.bind(binding, "A")
        y.bind(binding, "Y", output=True)
        return binding

    def run(self, a: np.ndarray, cpu: bool = False, graph_id=None) -> Buffer:
        device, session = (self.ctx.cpu, self.cpu_session) if cpu else (self.ctx.device, self.session)
        a_buf = Buffer.upload(device, a, self.case.dtype)
        y = Buffer.poisoned(device, (*a.shape[:-1], self.case.n), self.case.dtype)
        session.run_with_iobinding(self.binding(session, a_buf, y), device.run_options(graph_id))
        device.synchronize()
        return y


def case_data(rng, case: Case):
    a = representable(rng.standard_normal((1, case.m, case.k)), case.dtype)
    b = representable(rng.standard_normal((case.k, case.n)) / np.sqrt(max(case.k, 1)), case.dtype)
    return a, b


def check_case(ctx: Context, case: Case) -> dict:
    a, b = case_data(ctx.rng, case)
    runner = Runner(ctx, case, b)
    got, want = runner.run(a), runner.run(a, cpu=True)
    g, w = got.floats(), want.floats()
    summed = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    bound = 2 * case.k * U["float32"] * summed + 2 * U[case.dtype] * np.abs(w) + 1e-30
    problems = []
    ratio = None
    if np.isnan(g).any():
        problems.append(f"{int(np.isnan(g).sum())} elements NaN or unwritten")
    else:
        ratio = float(np.max(np.abs(g - w) / bound))
        if ratio > 1:
            problems.append(f"max error {ratio:.3g} x the tolerance")
    bits = got.bits()
    bad_rows = [i for i in range(case.m) if not np.array_equal(runner.run(a[:, i:i + 1]).bits(), bits[:, i:i + 1])]
    lo, hi = case.m // 3, max(case.m // 3 + 1, 2 * case.m // 3)
    if case.m > 1 and not np.array_equal(runner.run(a[:, lo:hi]).bits(), bits[:, lo:hi]):
        bad_rows.append(f"slice {lo}:{hi}")
    if bad_rows:
        problems.append(f"rows differ from their 1-row calls: {bad_rows[:6]}")
    return {"case": case.label(), "ok": not problems, "problem": "; ".join(problems) or None, "shape": asdict(case),
            "err_over_tol": ratio, "bit_equal_cpu": float(np.mean(bits == want.bits())), "width_consistent": not bad_rows}


def check_graph(ctx: Context, case: Case, steps: int = 4) -> dict:
    label = f"CUDA graph: {case.label()}"
    a, b = case_data(ctx.rng, case)
    graph = Runner(ctx, case, b, graph=ctx.on_gpu, cpu=False)
    plain = Runner(ctx, case, b, cpu=False)
    device = ctx.device
    a_buf = Buffer.upload(device, a, case.dtype)
    y = Buffer.poisoned(device, (1, case.m, case.n), case.dtype)
    binding = graph.binding(graph.session, a_buf, y)
    bad = []
    for step in range(steps):
        if step:
            a = representable(ctx.rng.standard_normal(a.shape), case.dtype)
            a_buf.write(a)
        want = plain.run(a)
        y.fill_nan()
        graph.session.run_with_iobinding(binding, device.run_options(1 if ctx.on_gpu else None))
        device.synchronize()
        if not np.array_equal(y.raw(), want.raw()):
            bad.append(f"step {step}")
    return {"case": label, "ok": not bad, "shape": asdict(case), "steps": steps,
            "problem": f"differs from plain runs: {bad}" if bad else None}


def check_two_weights(ctx: Context, case: Case, n2: int) -> dict:
    label = f"two weights: {case.label()} N2={n2}"
    a, b = case_data(ctx.rng, case)
    b2 = representable(ctx.rng.standard_normal((case.k, n2)) / np.sqrt(case.k), case.dtype)
    device = ctx.device
    session = make_session(device, fm.model(case.k, case.n, case.dtype, weight=b, weight2=b2, node_name=NODE))
    a_buf = Buffer.upload(device, a, case.dtype)
    y = Buffer.poisoned(device, (1, case.m, case.n), case.dtype)
    y2 = Buffer.poisoned(device, (1, case.m, n2), case.dtype)
    binding = session.io_binding()
    a_buf.bind(binding, "A")
    y.bind(binding, "Y", output=True)
    y2.bind(binding, "Y2", output=True)
    session.run_with_iobinding(binding, device.run_options(None))
    device.synchronize()
    one = Runner(ctx, case, b, cpu=False).run(a)
    two = Runner(ctx, Case(case.k, n2, case.m, case.dtype), b2, cpu=False).run(a)
    problems = [f"{name} differs from the one-weight node's" for name, got, want in (("Y", y, one), ("Y2", y2, two))
                if not np.array_equal(got.raw(), want.raw())]
    problems += [f"{name} has NaN or unwritten elements" for name, got in (("Y", y), ("Y2", y2)) if np.isnan(got.floats()).any()]
    return {"case": label, "ok": not problems, "problem": "; ".join(problems) or None, "shape": {**asdict(case), "n2": n2}}


def check_float_matmul(ctx: Context):
    for case in FIXED + random_cases(ctx.rng, ctx.random_cases):
        ctx.started(case.label())
        yield check_case(ctx, case)
    for case in (Case(5120, 48, 1), Case(5120, 48, 4)):
        ctx.started(f"CUDA graph: {case.label()}")
        yield check_graph(ctx, case)
    for case, n2 in ((Case(5120, 48, 1), 48), (Case(5120, 48, 4), 48), (Case(5120, 48, 2048), 48),
                     (Case(1000, 24, 3, "bfloat16"), 17), (Case(640, 8, 9, "float32"), 200)):
        ctx.started(f"two weights: {case.label()} N2={n2}")
        yield check_two_weights(ctx, case, n2)
