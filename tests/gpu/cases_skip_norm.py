"""ort_mtp::SkipSimplifiedLayerNormalization on the device: the checks of the skip-norm group
(csrc/norm/skip_norm_cuda.cu).

Every case has fresh random input, skip, gamma (and bias) exactly representable in the element type,
runs the one-node model with IOBinding on device buffers, both outputs poisoned with NaN first (an
element the kernel leaves unwritten fails):

  1. CUDA against our CPU op: the 27B-class norm (H = 5120, fp16) at M = 1..5 and a 2,048-row
     prefill, bf16 with bias, fp32 at an H that is no multiple of the block's 256 threads, H = 1 and
     the kernel's largest H (12280); the residual sum bit-identical (one rounding of the same float32
     value), the output within TOLERANCE.
  2. Every row of the M-row call bit-identical to the 1-row call on that row.
  3. ORT's CUDA graph: capture, then replays with new inputs written into the bound buffers, each
     bit-equal to a plain run.

TOLERANCE. Both kernels sum the H squares in float32 (the CPU in order, CUDA in 256 strided partial
sums combined by a tree): each within H u_32 of the exact sum of |s|^2, half of that through the
square root, a few float32 products after it, and each output rounds to T once:
|cuda - cpu| <= ((H + 8) u_32 + 2 u_T) |the exact s / rms x gamma|.

One record per case: {"case": label, "ok": bool, "problem": str | None, ...}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from harness import UNIT_ROUNDOFF as U, Buffer, Context  # first: it puts the checkout (driver, ops) on sys.path

from driver.device import make_session  # noqa: E402
import ops.norm as norm  # noqa: E402
from ops.nbits import round_to  # noqa: E402

NODE = "/model/layers.1/post_attention_layernorm"
EPS = 1e-6
OUTPUTS = ("output", "input_skip_bias_sum")


@dataclass(frozen=True)
class Case:
    hidden: int
    m: int
    dtype: str = "float16"
    bias: bool = False

    def label(self) -> str:
        return f"{self.dtype} H={self.hidden} M={self.m}{' bias' if self.bias else ''}"


FIXED = [Case(5120, m) for m in (1, 2, 3, 4, 5)] + [
    Case(5120, 2048),              # a prefill chunk
    Case(4096, 4, "bfloat16", True),
    Case(1000, 7, "float32"),      # H % 256 != 0
    Case(1, 3, "float32", True),
    Case(norm.MAX_HIDDEN, 2),      # the kernel's largest row: its sums and the warps' fill 48 KB of shared memory
]


class Runner:
    def __init__(self, ctx: Context, case: Case, gamma, bias, graph: bool = False, cpu: bool = True):
        self.ctx, self.case = ctx, case
        model = norm.model(case.hidden, case.dtype, node_name=NODE, epsilon=EPS, gamma=gamma, bias=bias)
        self.session = make_session(ctx.device, model, graph_capture=graph)
        self.cpu_session = make_session(ctx.cpu, model) if cpu else None

    def bind(self, session, inputs: list[Buffer], outputs: list[Buffer]):
        binding = session.io_binding()
        for name, buf in zip(("input", "skip"), inputs):
            buf.bind(binding, name)
        for name, buf in zip(OUTPUTS, outputs):
            buf.bind(binding, name, output=True)
        return binding

    def run(self, x: np.ndarray, r: np.ndarray, cpu: bool = False, graph_id=None) -> list[Buffer]:
        device, session = (self.ctx.cpu, self.cpu_session) if cpu else (self.ctx.device, self.session)
        inputs = [Buffer.upload(device, v, self.case.dtype) for v in (x, r)]
        outputs = [Buffer.poisoned(device, x.shape, self.case.dtype) for _ in OUTPUTS]
        session.run_with_iobinding(self.bind(session, inputs, outputs), device.run_options(graph_id))
        device.synchronize()
        return outputs


def case_data(rng, case: Case):
    x, r = (round_to(rng.standard_normal((1, case.m, case.hidden)), case.dtype) for _ in range(2))
    gamma = round_to(1 + rng.standard_normal(case.hidden) / 4, case.dtype)
    bias = round_to(rng.standard_normal(case.hidden), case.dtype) if case.bias else None
    return x, r, gamma, bias


def check_case(ctx: Context, case: Case) -> dict:
    x, r, gamma, bias = case_data(ctx.rng, case)
    runner = Runner(ctx, case, gamma, bias)
    (y, s), (y_cpu, s_cpu) = runner.run(x, r), runner.run(x, r, cpu=True)
    want, _ = norm.reference(x, r, gamma, EPS, bias)
    bound = ((case.hidden + 8) * U["float32"] + 2 * U[case.dtype]) * np.abs(want) + 1e-30
    problems, ratio = [], None
    g = y.floats()
    if np.isnan(g).any() or np.isnan(s.floats()).any():
        problems.append("NaN or unwritten elements")
    else:
        ratio = float(np.max(np.abs(g - y_cpu.floats()) / bound))
        if ratio > 1:
            problems.append(f"output: max difference from the CPU op {ratio:.3g} x the tolerance")
        if not np.array_equal(s.bits(), s_cpu.bits()):
            problems.append("input_skip_bias_sum differs from the CPU op's")
    y_bits = y.bits()
    rows = [i for i in range(case.m) if i < 64 or i % 97 == 0]  # a prefill: a sample of its rows
    bad = [i for i in rows if not np.array_equal(runner.run(x[:, i:i + 1], r[:, i:i + 1])[0].bits(), y_bits[:, i:i + 1])]
    if bad:
        problems.append(f"rows differ from their 1-row calls: {bad[:6]}")
    return {"case": case.label(), "ok": not problems, "problem": "; ".join(problems) or None, "shape": asdict(case),
            "err_over_tol": ratio, "bit_equal_cpu": float(np.mean(y_bits == y_cpu.bits())), "width_consistent": not bad}


def check_graph(ctx: Context, case: Case, steps: int = 4) -> dict:
    label = f"CUDA graph: {case.label()}"
    x, r, gamma, bias = case_data(ctx.rng, case)
    graph = Runner(ctx, case, gamma, bias, graph=ctx.on_gpu, cpu=False)
    plain = Runner(ctx, case, gamma, bias, cpu=False)
    device = ctx.device
    inputs = [Buffer.upload(device, v, case.dtype) for v in (x, r)]
    outputs = [Buffer.poisoned(device, x.shape, case.dtype) for _ in OUTPUTS]
    binding = graph.bind(graph.session, inputs, outputs)
    bad = []
    for step in range(steps):
        if step:
            x, r = (round_to(ctx.rng.standard_normal(x.shape), case.dtype) for _ in range(2))
            inputs[0].write(x)
            inputs[1].write(r)
        want = plain.run(x, r)
        for buf in outputs:
            buf.fill_nan()
        graph.session.run_with_iobinding(binding, device.run_options(1 if ctx.on_gpu else None))
        device.synchronize()
        if not all(np.array_equal(got.raw(), w.raw()) for got, w in zip(outputs, want)):
            bad.append(f"step {step}")
    return {"case": label, "ok": not bad, "shape": asdict(case), "steps": steps,
            "problem": f"differs from plain runs: {bad}" if bad else None}


def check_skip_norm(ctx: Context):
    for case in FIXED:
        ctx.started(case.label())
        yield check_case(ctx, case)
    for case in (Case(5120, 1), Case(5120, 4, "bfloat16", True)):
        ctx.started(f"CUDA graph: {case.label()}")
        yield check_graph(ctx, case)
