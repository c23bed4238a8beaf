"""ort_mtp::MatMulNBits on the device: the checks of the smoke, matmul, decode and graph groups.

Every case has fresh random data (A, B, scales, zero points, bias: ops.nbits.random_weights) from the
run's seed, and is compared with the float64 reference (ops.nbits.reference) under one tolerance per
element: 1 ulp of the output type at |ref| (the final rounding, plus a flipped rounding) +
2^-24 * (K/16 + 64) * magnitude (fp32 accumulation in any order; magnitude = sum |a| |scale|
(|q| + |zp|), ops.nbits.magnitude). The output buffer is poisoned with NaN before each run, so an
element the kernel leaves unwritten fails.

  * check_smoke (groups smoke-*, one per kernel path, so that a fault names its path): small cases,
    M = 1, 2, 3, 6, 9, 17 on the same rows: the M=17 output against the reference, and every row of
    every M bit-identical to the same row at M=17.
  * check_matmul (group matmul): a fixed coverage list plus random cases, CUDA output against the
    reference and against our CPU op (the exact reference kernel), over fp16 / bf16 / fp32, block sizes
    16..256, zero points absent / packed / typed, bias, odd N, K % block != 0, 8 bits, M = 1..16 and
    large M.
  * check_decode_consistency (groups decode*): row i of an M-row call bit-identical to the M=1 call on
    row i alone, for M = 1..16, 17, 24, 33, 40: what makes a speculative verify's rows equal the decode
    rows.
  * check_graph (groups graph*): ORT's CUDA graph (enable_cuda_graph=1, one gpu_graph_id per M):
    capture, replay, replay after new data is written into the bound input buffer, and row 0 of the
    M=5 graph bit-identical to the M=1 graph.

Each check yields one record per case: {"case": label, "ok": bool, "problem": str | None, ...}.
Which kernel a case takes (the record's "path") comes from bench/gemv_plan.py, the mirror of the
kernel's plan, and is a label only.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from functools import lru_cache

import numpy as np

from harness import ROOT, Buffer, Context  # first: it puts the checkout (driver, ops) on sys.path

from driver.device import make_session  # noqa: E402
from ops import nbits, packing  # noqa: E402

MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23}
MIN_EXP = {"float16": -14, "bfloat16": -126, "float32": -126}


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of `dtype` values at |x| (subnormal spacing below the normal range)."""
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** MIN_EXP[dtype])))
    return 2.0 ** (e - MANTISSA[dtype])


def compare(y: np.ndarray, a: np.ndarray, w: nbits.NBitsWeights) -> dict:
    """y (float64) against the float64 reference under the module's tolerance."""
    ref = nbits.reference(a, w)
    mag = nbits.magnitude(a, w)
    tol = ulp(ref, w.dtype) + 2.0 ** -24 * (w.K / 16 + 64) * mag
    err = np.abs(y - ref)
    unwritten = int(np.isnan(y).sum())
    ratio = float(np.nanmax(err / tol)) if y.size else 0.0
    return {"max_err_over_tol": ratio, "unwritten": unwritten,
            "ok": bool(unwritten == 0 and np.all(err <= tol) and np.all(np.isfinite(y)))}


@lru_cache(maxsize=1)
def _gemv_plan():
    """bench/gemv_plan.py (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gemv_plan", ROOT / "bench" / "gemv_plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gemv_plan", module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def expected_path(dtype: str, bits: int, block: int, zp: str | None, K: int, N: int, variant: str = "mma") -> str:
    """Which CUDA kernel the op picks and how it cuts the problem on an H200 (132 SMs), from
    bench/gemv_plan.py, the mirror of PlanStream in matmul_nbits_cuda.cu (for the record;
    the real K-parts can be fewer, where the compiled kernel's registers leave fewer blocks per SM).
    Assumes 16-byte aligned A and B, as the checks' buffers are."""
    gemv_plan = _gemv_plan()
    fast = dtype != "float32" and bits == 4 and zp != "typed" and block in (32, 64, 128, 256)
    if variant == "tiles":  # the tiles kernel takes the stream kernel's cut with 256-k chunks
        plan = gemv_plan.plan(N, K, 32)
        return f"tiles(kparts={plan.kparts},tiles={plan.tiles},blocks={plan.blocks})"
    if not fast or variant == "generic":
        return "generic"
    plan = gemv_plan.plan(N, K, block)
    if plan is None:
        return "generic"
    return f"mma(kc={plan.kc},kparts={plan.kparts},tiles={plan.tiles},blocks={plan.blocks})"


def kernel_path(ctx: Context, dtype, bits, block, zp, K, N, tiles: bool = False) -> str:
    """expected_path under this process's kernel switches (ORT_MTP_GEMV_VARIANT / _PDL)."""
    path = expected_path(dtype, bits, block, zp, K, N, "tiles" if tiles else ctx.variant)
    return path + ("+pdl" if ctx.pdl and path.startswith("mma") else "")


def random_a(rng, M: int, K: int, dtype: str) -> np.ndarray:
    return nbits.round_to(rng.uniform(-1.0, 1.0, size=(M, K)), dtype)


def _tiles(w: nbits.NBitsWeights) -> nbits.NBitsWeights:
    """w with B and scales in the tiles layout (ops.packing)."""
    return dataclasses.replace(w, b=packing.pack_b(w.b, w.N, w.K),
                               scales=packing.pack_scales(w.scales, w.N, w.K, w.block_size))


class MatMulRunner:
    """One weight set as a single-node ort_mtp model (ops.nbits.single_node_model), on the device under
    test and on the CPU EP. tiles: the weights packed by ops.packing, the node with packing=1 (the CPU
    op reads them too). graph: the device session captures ORT CUDA graphs. second / activation: the
    node's second weight set (outputs Y and Y2, or with activation="swiglu" the one Y)."""

    def __init__(self, ctx: Context, w: nbits.NBitsWeights, graph: bool = False, with_cpu: bool = True,
                 tiles: bool = False, second: nbits.NBitsWeights | None = None, activation: str | None = None):
        self.device, self.cpu, self.w = ctx.device, ctx.cpu, w
        self.outputs = [("Y", w.N)] + ([("Y2", second.N)] if second is not None and activation is None else [])
        if tiles:
            w, second = _tiles(w), (_tiles(second) if second is not None else None)
        model = nbits.single_node_model(w, domain="ort_mtp", a_shape=("M", None), packing=1 if tiles else None,
                                        second=second, activation=activation)
        self.session = make_session(self.device, model, graph_capture=graph)
        self.cpu_session = make_session(self.cpu, model) if with_cpu and not graph else None

    def bound(self, a: np.ndarray, cpu: bool = False):
        """(A buffer holding `a`, NaN-poisoned Y buffer, their IOBinding) on the device or the CPU EP."""
        a_buf, (y_buf, *_), binding = self.bound_all(a, cpu)
        return a_buf, y_buf, binding

    def bound_all(self, a: np.ndarray, cpu: bool = False):
        """(A buffer holding `a`, [NaN-poisoned buffer per output], their IOBinding)."""
        device, session = self._side(cpu)
        a_buf = Buffer.upload(device, a, self.w.dtype)
        outs = [Buffer.poisoned(device, (a.shape[0], n), self.w.dtype) for _, n in self.outputs]
        binding = session.io_binding()
        a_buf.bind(binding, "A")
        for (name, _), buf in zip(self.outputs, outs):
            buf.bind(binding, name, output=True)
        return a_buf, outs, binding

    def run(self, a: np.ndarray, cpu: bool = False) -> Buffer:
        """Y for A (float32 values representable in w.dtype), written into a poisoned buffer."""
        return self.run_all(a, cpu)[0]

    def run_all(self, a: np.ndarray, cpu: bool = False) -> list[Buffer]:
        """Every output for A, each written into a poisoned buffer."""
        device, session = self._side(cpu)
        _, outs, binding = self.bound_all(a, cpu)
        session.run_with_iobinding(binding, device.run_options(None))
        return outs

    def _side(self, cpu: bool):
        return (self.cpu, self.cpu_session) if cpu else (self.device, self.session)


# ---------------------------------------------------------------------------------------------------
# Full random cases (group matmul)

COVERAGE = [  # dtype, K, N, bits, block, zero points, bias
    ("float16", 1024, 384, 4, 32, None, False),
    ("bfloat16", 1024, 384, 4, 32, None, True),
    ("float16", 640, 129, 4, 32, "packed", True),
    ("bfloat16", 640, 77, 4, 64, "packed", False),
    ("float16", 1024, 1, 4, 128, None, True),
    ("bfloat16", 2048, 200, 4, 256, "packed", False),
    ("float16", 2048, 5120, 4, 32, None, False),
    ("bfloat16", 4096, 1000, 4, 32, "packed", True),
    ("float16", 1000, 130, 4, 16, None, False),
    ("float16", 200, 64, 4, 32, "typed", False),
    ("float32", 512, 100, 4, 32, "packed", True),
    ("float32", 333, 17, 4, 64, "typed", False),
    ("float16", 512, 99, 8, 32, "packed", False),
    ("bfloat16", 256, 50, 8, 128, None, True),
    ("bfloat16", 96, 31, 4, 32, None, False),
    ("float16", 384, 200, 4, 64, "typed", False),
    ("float32", 4096, 16, 4, 256, None, False),
]


def random_cases(rng, count: int) -> list:
    cases = []
    for _ in range(count):
        dtype = str(rng.choice(["float16", "bfloat16", "float16", "bfloat16", "float32"]))
        bits = int(rng.choice([4, 4, 4, 8]))
        block = int(rng.choice([16, 32, 32, 64, 128, 256]))
        if rng.random() < 0.6:  # mostly shapes the fast path takes
            K = int(rng.integers(1, 12)) * 256
        else:
            K = int(rng.integers(1, 1200))
        N = int(rng.integers(1, 1500))
        zp = [None, "packed", "typed"][int(rng.integers(0, 3))]
        cases.append((dtype, K, N, bits, block, zp, bool(rng.random() < 0.5)))
    return cases


def case_label(dtype, K, N, bits, block, zp, bias) -> str:
    return f"{dtype} K={K} N={N} bits={bits} block={block} zp={zp or 'none'}{' bias' if bias else ''}"


def check_matmul(ctx: Context, coverage: list | None = None):
    """Group matmul: `coverage` (default COVERAGE) plus ctx.random_cases random cases, on the device
    against the float64 reference and against our CPU op. One record per (case, M)."""
    rng = ctx.rng
    for dtype, K, N, bits, block, zp, bias in (COVERAGE if coverage is None else coverage) + \
            random_cases(rng, ctx.random_cases):
        label = case_label(dtype, K, N, bits, block, zp, bias)
        ctx.started(label)
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(ctx, w)
        big = [17, 33, 100, 517] if K * N <= 1_000_000 else [17, 33, 100]
        ms = sorted({1, 16, int(rng.integers(2, 16)), int(rng.choice(big))})
        for M in ms:
            ctx.started(f"{label} M={M}")
            a = random_a(rng, M, K, dtype)
            y = runner.run(a).floats()
            y_cpu = runner.run(a, cpu=True).floats()
            r = compare(y, a, w)
            r_cpu = compare(y_cpu, a, w)
            diff_ulps = float(np.max(np.abs(y - y_cpu) / ulp(y_cpu, dtype))) if y.size else 0.0
            ok = r["ok"] and r_cpu["ok"]
            problem = None if ok else (
                f"M={M}: {ctx.device.name} error/tolerance {r['max_err_over_tol']:.3g}, unwritten {r['unwritten']}; "
                f"CPU op error/tolerance {r_cpu['max_err_over_tol']:.3g}")
            yield dict(case=label, M=M, path=kernel_path(ctx, dtype, bits, block, zp, K, N),
                       cuda=r, cpu_op=r_cpu, max_diff_vs_cpu_op_ulps=diff_ulps, ok=ok, problem=problem)


# ---------------------------------------------------------------------------------------------------
# Smoke cases (groups smoke-*)

# Smoke cases: small, one group per kernel path. bench/gemv_plan.py gives the cut on a 132-SM H200
# (the comments): K-parts x m-tiles per block; rows past N in the last block are zero-filled.
SMOKE_MS = [1, 2, 3, 6, 9, 17]  # 8-token and 16-token templates, two token groups at 17
SMOKE_CASES = {  # dtype, K, N, bits, block, zero points, bias
    "generic": [("float32", 512, 100, 4, 32, "packed", True), ("float16", 512, 99, 8, 32, "packed", False),
                ("bfloat16", 256, 50, 4, 64, "typed", True), ("float16", 1000, 130, 4, 16, None, False),
                ("bfloat16", 96, 31, 4, 32, None, False), ("float32", 333, 17, 8, 128, "typed", True)],
    "mma": [("float16", 512, 200, 4, 32, None, True), ("float16", 512, 200, 4, 32, "packed", False),  # 1 K-part
            ("bfloat16", 512, 200, 4, 32, None, False), ("bfloat16", 512, 200, 4, 32, "packed", True),
            ("float16", 512, 130, 4, 64, "packed", False), ("bfloat16", 512, 130, 4, 64, None, True),
            ("float16", 512, 77, 4, 128, None, False), ("bfloat16", 512, 77, 4, 128, "packed", False),
            ("float16", 1024, 129, 4, 256, "packed", True), ("bfloat16", 1024, 129, 4, 256, None, False),
            ("float16", 384, 150, 4, 32, None, False), ("bfloat16", 384, 150, 4, 64, "packed", True),  # kc 128
            ("float16", 512, 5000, 4, 32, None, True)],        # 4 m-tiles per block, 79 blocks
    "mma-kparts": [("float16", 2048, 130, 4, 32, None, False),       # 4 K-parts
                   ("bfloat16", 8192, 128, 4, 32, "packed", True),  # 16 K-parts
                   ("float16", 4096, 300, 4, 128, "packed", False), # 8 K-parts
                   ("bfloat16", 4096, 200, 4, 256, None, True),     # 4 K-parts, kc 512
                   ("float16", 1280, 64, 4, 64, "packed", False),   # 2 K-parts, 5 chunks: uneven runs
                   ("bfloat16", 8192, 700, 4, 32, "packed", False), # 16 K-parts, 44 blocks
                   ("float16", 2048, 17000, 4, 32, None, True)],    # two shapes: 521 blocks of 3 K-parts x 2
                                                                    # m-tiles after 7 of 2 x 3 (gate_up's cut)
    # Layer-like cuts (several MB each): kept out of the memcheck run for time.
    "mma-wide": [("bfloat16", 512, 20000, 4, 32, "packed", False),  # 1 K-part x 4 m-tiles, 313 blocks
                 ("float16", 256, 67000, 4, 32, "packed", False),   # 1 K-part x 4 m-tiles, 1047 blocks
                 ("bfloat16", 256, 40000, 4, 64, None, True),       # 1 K-part x 4, kc 256
                 ("float16", 4096, 3800, 4, 32, None, True),        # 8 K-parts, 238 blocks
                 ("bfloat16", 2048, 5120, 4, 32, None, False),      # 4 K-parts
                 ("float16", 2560, 3000, 4, 32, "packed", False),   # 5 K-parts, 2 chunks each
                 ("bfloat16", 1024, 9000, 4, 64, "packed", True),   # 2 K-parts x 2 m-tiles
                 ("bfloat16", 1536, 30007, 4, 64, None, False)],    # two shapes: 98 blocks of 1 K-part x 6
                                                                    # m-tiles, 430 of 2 x 3; last tile partial
    # Weights in the tiles layout (packing=1, gemv_tiles.cuh): N % 16 == 0, K % 256 == 0, no zero points.
    "tiles": [("float16", 512, 64, 4, 32, None, True), ("bfloat16", 512, 64, 4, 32, None, False),   # 1 K-part
              ("float16", 1024, 208, 4, 64, None, False), ("bfloat16", 1024, 208, 4, 128, None, True),
              ("float16", 2048, 128, 4, 32, None, False),          # 4 K-parts
              ("bfloat16", 8192, 128, 4, 64, None, True),          # 16 K-parts
              ("float16", 1280, 64, 4, 128, None, False),          # 2 K-parts, 5 chunks: uneven runs
              ("float16", 256, 20000, 4, 32, None, True),          # 4 m-tiles per block, several waves
              ("float16", 2048, 17008, 4, 32, None, False),        # two shapes, the last block partial
              ("bfloat16", 5120, 17408, 4, 32, None, True)],       # the 27B gate_up cut
    "plain": [("float16", 512, 200, 4, 32, None, True), ("bfloat16", 2048, 130, 4, 32, "packed", False),
              ("float16", 2048, 5120, 4, 32, None, False)],
}


def check_smoke(ctx: Context, cases: list, tiles: bool = False):
    """Per case: M = SMOKE_MS on the same rows; M=17 against the float64 reference, every row of
    every M bit-identical to the same row at M=17. One record per case. tiles: the weights in the
    tiles layout (packing=1)."""
    rng = ctx.rng
    for dtype, K, N, bits, block, zp, bias in cases:
        label = case_label(dtype, K, N, bits, block, zp, bias)
        ctx.started(label)
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(ctx, w, with_cpu=False, tiles=tiles)
        a = random_a(rng, max(SMOKE_MS), K, dtype)
        y_full = runner.run(a)
        r = compare(y_full.floats(), a, w)
        full_bits = y_full.bits()
        mismatches = []
        for M in SMOKE_MS[:-1]:
            y = runner.run(np.ascontiguousarray(a[:M])).bits()
            rows = [i for i in range(M) if not np.array_equal(y[i], full_bits[i])]
            if rows:
                mismatches.append({"M": M, "rows": rows[:8]})
        ok = r["ok"] and not mismatches
        problem = None
        if not r["ok"]:
            problem = f"M={max(SMOKE_MS)}: error/tolerance {r['max_err_over_tol']:.3g}, unwritten {r['unwritten']}"
        elif mismatches:
            problem = f"rows differ from the M={max(SMOKE_MS)} call: {mismatches[:3]}"
        yield dict(case=label, Ms=SMOKE_MS, path=kernel_path(ctx, dtype, bits, block, zp, K, N, tiles),
                   accuracy=r, mismatches=mismatches, ok=ok, problem=problem)


# ---------------------------------------------------------------------------------------------------
# Decode-consistency (groups decode*)

DECODE = [  # dtype, K, N, bits, block, zero points, bias
    ("float16", 2048, 5120, 4, 32, None, False),     # 4 K-parts
    ("bfloat16", 1024, 2000, 4, 32, "packed", True),  # packed zero points
    ("float16", 640, 129, 4, 64, None, False),       # kc 128
    ("bfloat16", 1024, 300, 4, 128, None, True),
    ("float16", 2048, 300, 4, 256, "packed", False),
    ("float16", 512, 20000, 4, 32, None, False),     # 4 m-tiles per block, 313 blocks
    ("bfloat16", 256, 67000, 4, 32, None, True),     # several waves
    ("float16", 5120, 17408, 4, 32, None, False),    # the 27B gate_up cut: 2 K-parts x 2 m-tiles
    ("float16", 17408, 5120, 4, 32, None, True),     # the 27B down cut: 8 K-parts
    ("float32", 1000, 70, 4, 32, "typed", True),     # general kernel
    ("float16", 512, 90, 8, 32, None, False),        # general kernel, 8 bits
]
DECODE_MS = list(range(1, 17)) + [17, 24, 33, 40]


def check_decode_consistency(ctx: Context, cases: list | None = None):
    """Row i of every M-row call bit-identical to the M=1 call on row i, M = DECODE_MS; and the
    largest M against the reference. One record per case."""
    rng = ctx.rng
    for dtype, K, N, bits, block, zp, bias in DECODE if cases is None else cases:
        label = case_label(dtype, K, N, bits, block, zp, bias)
        ctx.started(label)
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(ctx, w, with_cpu=False)
        a = random_a(rng, max(DECODE_MS), K, dtype)
        single = [runner.run(np.ascontiguousarray(a[i:i + 1])).bits()[0] for i in range(a.shape[0])]
        bad = []
        for M in DECODE_MS:
            y = runner.run(np.ascontiguousarray(a[:M])).bits()
            rows = [i for i in range(M) if not np.array_equal(y[i], single[i])]
            if rows:
                bad.append({"M": M, "rows": rows[:8], "count": len(rows)})
        full = compare(runner.run(np.ascontiguousarray(a)).floats(), a, w)
        ok = not bad and full["ok"]
        problem = None if ok else (f"rows differ from the M=1 call: {bad[:3]}" if bad else
                                   f"M={max(DECODE_MS)}: error/tolerance {full['max_err_over_tol']:.3g}")
        yield dict(case=label, path=kernel_path(ctx, dtype, bits, block, zp, K, N),
                   Ms=DECODE_MS, mismatches=bad, accuracy_at_max_M=full, ok=ok, problem=problem)


# ---------------------------------------------------------------------------------------------------
# ORT's CUDA graph (groups graph*)

GRAPH_CASES = [("float16", 1024, 512, 32, None), ("bfloat16", 2048, 700, 64, "packed"),  # dtype, K, N, block, zp
               ("float32", 512, 64, 32, None)]
GRAPH_MS = [1, 5, 16]  # graph ids 1, 2, 3


def check_graph(ctx: Context, cases: list | None = None):
    """Per case: one captured graph per M (gpu_graph_id 1, 2, 3): the first run, the capture or first
    replay and a replay against the reference; new data written into the bound input, then a replay;
    then row 0 of the M=5 graph against the M=1 graph on the same row, bitwise. One record per case."""
    rng = ctx.rng
    for dtype, K, N, block, zp in GRAPH_CASES if cases is None else cases:
        label = case_label(dtype, K, N, 4, block, zp, True)
        ctx.started(label)
        w = nbits.random_weights(rng, K, N, block_size=block, dtype=dtype, zero_points=zp, bias=True)
        runner = MatMulRunner(ctx, w, graph=ctx.on_gpu)
        session, device = runner.session, ctx.device
        record = dict(case=label, dtype=dtype, K=K, N=N, block=block, zero_points=zp, steps=[])
        ok = True
        bound = {}
        for graph_id, M in enumerate(GRAPH_MS, start=1):
            a = random_a(rng, M, K, dtype)
            a_buf, y_buf, binding = runner.bound(a)
            bound[M] = (a_buf, y_buf, binding, graph_id)
            for step in ("first run", "capture or replay", "replay"):
                session.run_with_iobinding(binding, device.run_options(graph_id))
                r = compare(y_buf.floats(), a, w)
                record["steps"].append({"M": M, "step": step, **r})
                ok &= r["ok"]
            a = random_a(rng, M, K, dtype)  # new data into the same buffer, then replay
            a_buf.write(a)
            y_buf.fill_nan()
            session.run_with_iobinding(binding, device.run_options(graph_id))
            r = compare(y_buf.floats(), a, w)
            record["steps"].append({"M": M, "step": "replay after new input", **r})
            ok &= r["ok"]
        # Decode-consistency across graphs: row 0 of the M=5 graph vs the M=1 graph on the same row.
        a1, y1, b1, g1 = bound[1]
        a5, y5, b5, g5 = bound[5]
        a1.write(a5.floats()[0:1])
        session.run_with_iobinding(b1, device.run_options(g1))
        session.run_with_iobinding(b5, device.run_options(g5))
        same = bool(np.array_equal(y1.bits()[0], y5.bits()[0]))
        record["row0_M5_equals_M1_bitwise"] = same
        record["ok"] = bool(ok and same)
        record["problem"] = None
        if not record["ok"]:
            bad = [f"M={x['M']} {x['step']}" for x in record["steps"] if not x["ok"]]
            record["problem"] = (f"failed steps {bad[:4]}" if bad else
                                 "row 0 of the M=5 graph differs from the M=1 graph")
        yield record


# ---------------------------------------------------------------------------------------------------
# Two weight sets on one A (group pair)

PAIR_MS = [1, 2, 5, 17]
PAIR_CASES = [  # dtype, K, N, N2, block, zero points, bias, tiles, activation
    ("float16", 5120, 17408, 17408, 32, None, False, True, "swiglu"),   # the 27B MLP's gate and up, tiles
    ("bfloat16", 1024, 208, 208, 64, None, True, True, "swiglu"),
    ("float16", 2048, 300, 300, 32, "packed", True, False, "swiglu"),   # the stream kernel
    ("bfloat16", 512, 77, 77, 128, None, False, False, "swiglu"),
    ("float32", 333, 40, 40, 32, "typed", True, False, "swiglu"),       # the general kernel
    ("float16", 512, 130, 130, 16, None, False, False, "swiglu"),
    ("float16", 1024, 64, 208, 32, None, True, True, None),             # two outputs
    ("bfloat16", 640, 129, 31, 64, "packed", False, False, None),
    ("float32", 256, 17, 9, 32, None, True, False, None),
]


def swiglu_bound(g: np.ndarray, u: np.ndarray, dtype: str) -> np.ndarray:
    """How far Y may be from silu(g) * u in float64, for the g and u the node holds: SiluMul's float32
    sequence (about 1 ulp on exp, a few roundings after it: 4 float32 ulps of the result) and the
    final rounding to the type (1 ulp)."""
    want = g / (1.0 + np.exp(-g)) * u
    return 4 * ulp(want, "float32") + ulp(want, dtype) + 2.0 ** -140


def check_pair(ctx: Context, cases: list | None = None):
    """Per case (group pair): the two-weight node against one-weight nodes of its two sets, on the
    device: Y and Y2 bit-identical to theirs (no activation), or Y within swiglu_bound of
    silu(g) * u of their outputs g and u (activation="swiglu"); every row of M = PAIR_MS bit-identical
    to the same row at the largest M. One record per case."""
    rng = ctx.rng
    for dtype, K, N, N2, block, zp, bias, tiles, activation in PAIR_CASES if cases is None else cases:
        label = (f"{case_label(dtype, K, N, 4, block, zp, bias)} N2={N2}{' tiles' if tiles else ''} "
                 f"{activation or 'two outputs'}")
        ctx.started(label)
        sets = [nbits.random_weights(rng, K, n, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
                for n in (N, N2)]
        pair = MatMulRunner(ctx, sets[0], with_cpu=False, tiles=tiles, second=sets[1], activation=activation)
        singles = [MatMulRunner(ctx, w, with_cpu=False, tiles=tiles) for w in sets]
        a = random_a(rng, max(PAIR_MS), K, dtype)
        full = pair.run_all(a)
        parts = [s.run(a).floats() for s in singles]
        problem, ratio = None, 0.0
        if activation is None:
            for name, got, want in zip(("Y", "Y2"), full, parts):
                if not np.array_equal(got.floats(), want):
                    problem = f"{name} differs from the one-weight node's output"
                    break
        else:
            y = full[0].floats()
            err = np.abs(y - parts[0] / (1.0 + np.exp(-parts[0])) * parts[1])
            tol = swiglu_bound(parts[0], parts[1], dtype)
            ratio = float(np.nanmax(err / tol)) if y.size else 0.0
            if not (np.all(np.isfinite(y)) and np.all(err <= tol)):
                problem = f"Y is {ratio:.3g} bounds from silu(g) * u of the one-weight nodes' outputs"
        full_bits = [o.bits() for o in full]
        mismatches = []
        for M in PAIR_MS[:-1]:
            outs = pair.run_all(np.ascontiguousarray(a[:M]))
            for name, o, want in zip(("Y", "Y2"), outs, full_bits):
                rows = [i for i in range(M) if not np.array_equal(o.bits()[i], want[i])]
                if rows:
                    mismatches.append({"M": M, "output": name, "rows": rows[:8]})
        if problem is None and mismatches:
            problem = f"rows differ from the M={max(PAIR_MS)} call: {mismatches[:3]}"
        yield dict(case=label, Ms=PAIR_MS, path=kernel_path(ctx, dtype, 4, block, zp, K, N, tiles),
                   swiglu_error_over_bound=ratio, mismatches=mismatches, ok=problem is None, problem=problem)
