"""Device correctness check of the CUDA paths of ort_mtp::MatMulNBits and ort_mtp::CopySlots.

    python bench/check_cuda_ops.py                  # every group (about 2 minutes on the GPU machine)
    python bench/check_cuda_ops.py --smoke          # one tiny case per kernel path and template (~40 s)
    python bench/check_cuda_ops.py --smoke --sanitizer memcheck     # each group under compute-sanitizer
    python bench/check_cuda_ops.py --groups smoke-mma,decode        # chosen groups
    python bench/check_cuda_ops.py --list           # the groups, what each covers, its environment
    python bench/check_cuda_ops.py --jobs 4         # four groups at a time (separate processes)
    python bench/check_cuda_ops.py --cpu-dry-run    # the same logic on the CPU EP (tests the script)

Each group runs in its own process (ORT_MTP_GEMV_* are read once per process, and a kernel that
faults leaves a CUDA context that fails every later call), so one crash cannot mask the rest. The
parent touches no GPU itself: it starts the workers (under compute-sanitizer with --sanitizer, which
then also marks a group failed when the tool reports an error), keeps each worker's output in
<out>/<report>_logs/<group>.log, prints one line per group as it ends (PASS/FAIL, cases, seconds,
the first error), writes <out>/<report>.json and prints a summary table last; exit status 1 when any
group failed, 2 on a bad call. <out> is --out, else $OUT, else bench/results; <report> is
check_cuda_ops, plus _smoke and _<tool> when those options are given.

Builds nothing: the library comes from ops.library_path() (ORT_MTP_LIBRARY overrides).

MatMulNBits, every case with fresh random data (A, B, scales, zero points, bias):
  * smoke groups, one per kernel path so that a fault names its path: the general kernel; the
    tensor-core kernel with one K-part and with 2..16 K-parts (every dtype, block size, zero-point
    kind and 8/16-token template, 1..4 m-tiles per block, several waves); without PDL; the CUDA-core
    kernel (simt). Per case
    M = 1, 2, 3, 6, 9, 17 on the same rows: the M=17 output against the float64 reference, and every
    row of every M bit-identical to the same row at M=17.
  * full random cases: CUDA output vs the float64 reference (ops.nbits.reference) and vs our CPU op,
    over fp16 / bf16 / fp32, block sizes 16..256, zero points absent / packed / typed, bias, odd N,
    K % block != 0, 8 bits, M = 1..16 and large M. Tolerance per element: 1 ulp of the output type at
    |ref| (the final rounding, plus a flipped rounding) + 2^-24 * (K/16 + 64) * magnitude (fp32
    accumulation; magnitude = sum |a| |scale| (|q|+|zp|)). The output buffer is poisoned with NaN
    before each run, so an unwritten element fails.
  * decode-consistency: row i of an M-row call is bit-identical to the M=1 call on row i alone, for
    M = 1..16, 17, 24, 33, 40, on each kernel path (tensor-core default, and simt).
  * ORT's CUDA graph (enable_cuda_graph=1, one gpu_graph_id per M): capture, replay, replay after new
    data is written into the bound input buffer (PDL launches, the default, and plain launches).
CopySlots: slot promote in place (outputs bound to the destination buffers), slot copy and whole
copy into separate (poisoned) outputs, many tensors (more than one launch's worth), mixed dtypes and
odd byte counts, and in place under ORT's CUDA graph; each compared bit-exactly with numpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

import gemv_plan
from ort_device import BenchError, Device, device_info, out_dir

from ops import nbits, packing  # noqa: E402  (ort_device put the checkout on sys.path)

MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23}
MIN_EXP = {"float16": -14, "bfloat16": -126, "float32": -126}


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of `dtype` values at |x| (subnormal spacing below the normal range)."""
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** MIN_EXP[dtype])))
    return 2.0 ** (e - MANTISSA[dtype])


def expected_path(dtype: str, bits: int, block: int, zp: str | None, K: int, N: int, variant: str = "mma") -> str:
    """Which CUDA kernel the op picks and how it cuts the problem on an H200 (132 SMs), from
    bench/gemv_plan.py, the mirror of PlanStream / PlanSimt in matmul_nbits_cuda.cu (for the report;
    the real K-parts can be fewer, where the compiled kernel's registers leave fewer blocks per SM).
    Assumes 16-byte aligned A and B, as the checks' buffers are."""
    fast = dtype != "float32" and bits == 4 and zp != "typed" and block in (32, 64, 128, 256)
    if variant == "tiles":  # the tiles kernel takes the stream kernel's cut with 256-k chunks
        plan = gemv_plan.plan(N, K, 32)
        return f"tiles(kparts={plan.kparts},tiles={plan.tiles},blocks={plan.blocks})"
    if variant == "simt":
        return "simt" if fast and K % 32 == 0 else "generic"
    if not fast or variant == "generic":
        return "generic"
    plan = gemv_plan.plan(N, K, block)
    if plan is None:
        return "generic"
    return f"mma(kc={plan.kc},kparts={plan.kparts},tiles={plan.tiles},blocks={plan.blocks})"


def random_a(rng, M: int, K: int, dtype: str) -> np.ndarray:
    return nbits.round_to(rng.uniform(-1.0, 1.0, size=(M, K)), dtype)


class MatMulRunner:
    """One weight set as a single-node ort_mtp model, on the device under test and on the CPU EP.
    tiles: the weights packed by ops.packing, the node with packing=1 (the CPU op reads them too)."""

    def __init__(self, device: Device, w: nbits.NBitsWeights, graph: bool = False, with_cpu: bool = True,
                 tiles: bool = False):
        self.device, self.w = device, w
        stored = w
        if tiles:
            stored = dataclasses.replace(w, b=packing.pack_b(w.b, w.N, w.K),
                                         scales=packing.pack_scales(w.scales, w.N, w.K, w.block_size))
        model = nbits.single_node_model(stored, domain="ort_mtp", a_shape=("M", None), packing=1 if tiles else None)
        self.session = device.session(model, graph=graph)
        self.cpu_session = device.session(model, cpu=True) if with_cpu and not graph else None

    def run(self, a: np.ndarray, cpu: bool = False, graph_id: int | None = None):
        """Y for A (float32 values representable in w.dtype) as a poisoned-then-written tensor."""
        dev = self.device
        if cpu:
            a_t = dev.torch.from_numpy(a).to(_torch_dtype(dev, self.w.dtype))
            y_t = dev.torch.full((a.shape[0], self.w.N), float("nan"), dtype=a_t.dtype)
            session, name = self.cpu_session, "cpu"
        else:
            a_t = dev.tensor(a, self.w.dtype)
            y_t = dev.full((a.shape[0], self.w.N), self.w.dtype, float("nan"))
            session, name = self.session, dev.name
        binding = session.io_binding()
        _bind(dev, binding, "A", a_t, name)
        _bind(dev, binding, "Y", y_t, name, output=True)
        session.run_with_iobinding(binding, dev.run_options(graph_id) if not cpu else None)
        return y_t


def _torch_dtype(dev, dtype):
    return getattr(dev.torch, dtype)


def _bind(dev: Device, binding, name, t, where: str, output: bool = False):
    dtype = str(t.dtype).replace("torch.", "")
    elem = TensorProto.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype).type
    args = (where, 0, elem, list(t.shape), t.data_ptr())
    (binding.bind_output if output else binding.bind_input)(name, *args)


def compare(y: np.ndarray, a: np.ndarray, w: nbits.NBitsWeights) -> dict:
    ref = nbits.reference(a, w)
    mag = nbits.magnitude(a, w)
    tol = ulp(ref, w.dtype) + 2.0 ** -24 * (w.K / 16 + 64) * mag
    err = np.abs(y - ref)
    unwritten = int(np.isnan(y).sum())
    ratio = float(np.nanmax(err / tol)) if y.size else 0.0
    return {"max_err_over_tol": ratio, "unwritten": unwritten,
            "ok": bool(unwritten == 0 and np.all(err <= tol) and np.all(np.isfinite(y)))}


# ---------------------------------------------------------------------------------------------------
# MatMulNBits cases

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


def check_matmul(ctx: "Context", n_random: int):
    """Full random cases: CUDA vs float64 reference and vs our CPU op. Yields one record per (case, M)."""
    rng = ctx.rng
    for dtype, K, N, bits, block, zp, bias in COVERAGE + random_cases(rng, n_random):
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(ctx.device, w)
        big = [17, 33, 100, 517] if K * N <= 1_000_000 else [17, 33, 100]
        ms = sorted({1, 16, int(rng.integers(2, 16)), int(rng.choice(big))})
        for M in ms:
            a = random_a(rng, M, K, dtype)
            y = ctx.device.numpy(runner.run(a))
            y_cpu = ctx.device.numpy(runner.run(a, cpu=True))
            r = compare(y, a, w)
            r_cpu = compare(y_cpu, a, w)
            diff_ulps = float(np.max(np.abs(y - y_cpu) / ulp(y_cpu, dtype))) if y.size else 0.0
            ok = r["ok"] and r_cpu["ok"]
            problem = None if ok else (
                f"M={M}: CUDA error/tolerance {r['max_err_over_tol']:.3g}, unwritten {r['unwritten']}; "
                f"CPU op error/tolerance {r_cpu['max_err_over_tol']:.3g}")
            yield dict(case=case_label(dtype, K, N, bits, block, zp, bias), M=M, path=ctx.path(dtype, bits, block, zp, K, N),
                       cuda=r, cpu_op=r_cpu, max_diff_vs_cpu_op_ulps=diff_ulps, ok=ok, problem=problem)


# Smoke cases: small, one group per kernel path. bench/gemv_plan.py gives the cut on a 132-SM H200
# (the comments): K-parts x m-tiles per block; rows past N in the last block are zero-filled.
SMOKE_MS = [1, 2, 3, 6, 9, 17]  # 8-token and 16-token templates, two token groups at 17; simt's 1/2/4/8
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
    "simt": [("float16", 512, 200, 4, 32, None, True), ("bfloat16", 512, 130, 4, 32, "packed", False),
             ("float16", 1024, 77, 4, 128, "packed", False), ("bfloat16", 1024, 64, 4, 256, None, True),
             ("float16", 96, 5, 4, 64, None, False),            # K % 64 != 0: the last block is partial
             ("float32", 256, 40, 4, 32, None, False)],         # not taken by simt: the general kernel
}


def check_smoke(ctx: "Context", cases: list, tiles: bool = False):
    """Per case: M = SMOKE_MS on the same rows; M=17 against the float64 reference, every row of
    every M bit-identical to the same row at M=17. One record per case. tiles: the weights in the
    tiles layout (packing=1)."""
    rng = ctx.rng
    for dtype, K, N, bits, block, zp, bias in cases:
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(ctx.device, w, with_cpu=False, tiles=tiles)
        a = random_a(rng, max(SMOKE_MS), K, dtype)
        y_full = runner.run(a)
        r = compare(ctx.device.numpy(y_full), a, w)
        full_bits = ctx.device.bits(y_full)
        mismatches = []
        for M in SMOKE_MS[:-1]:
            y = ctx.device.bits(runner.run(np.ascontiguousarray(a[:M])))
            rows = [i for i in range(M) if not np.array_equal(y[i], full_bits[i])]
            if rows:
                mismatches.append({"M": M, "rows": rows[:8]})
        ok = r["ok"] and not mismatches
        problem = None
        if not r["ok"]:
            problem = f"M={max(SMOKE_MS)}: error/tolerance {r['max_err_over_tol']:.3g}, unwritten {r['unwritten']}"
        elif mismatches:
            problem = f"rows differ from the M={max(SMOKE_MS)} call: {mismatches[:3]}"
        yield dict(case=case_label(dtype, K, N, bits, block, zp, bias), Ms=SMOKE_MS,
                   path=ctx.path(dtype, bits, block, zp, K, N, tiles), accuracy=r, mismatches=mismatches, ok=ok,
                   problem=problem)


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


def check_decode_consistency(ctx: "Context"):
    """Row i of every M-row call bit-identical to the M=1 call on row i. One record per case."""
    rng, device = ctx.rng, ctx.device
    for dtype, K, N, bits, block, zp, bias in DECODE:
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(device, w, with_cpu=False)
        a = random_a(rng, max(DECODE_MS), K, dtype)
        single = [device.bits(runner.run(np.ascontiguousarray(a[i:i + 1])))[0] for i in range(a.shape[0])]
        bad = []
        for M in DECODE_MS:
            y = device.bits(runner.run(np.ascontiguousarray(a[:M])))
            rows = [i for i in range(M) if not np.array_equal(y[i], single[i])]
            if rows:
                bad.append({"M": M, "rows": rows[:8], "count": len(rows)})
        full = compare(device.numpy(runner.run(np.ascontiguousarray(a))), a, w)
        ok = not bad and full["ok"]
        problem = None if ok else (f"rows differ from the M=1 call: {bad[:3]}" if bad else
                                   f"M={max(DECODE_MS)}: error/tolerance {full['max_err_over_tol']:.3g}")
        yield dict(case=case_label(dtype, K, N, bits, block, zp, bias), path=ctx.path(dtype, bits, block, zp, K, N),
                   Ms=DECODE_MS, mismatches=bad, accuracy_at_max_M=full, ok=ok, problem=problem)


def check_graph(ctx: "Context") -> list[dict]:
    """CUDA graph capture/replay of the op, one graph per M, fresh data written into bound buffers."""
    device, rng = ctx.device, ctx.rng
    results = []
    for dtype, K, N, block, zp in [("float16", 1024, 512, 32, None), ("bfloat16", 2048, 700, 64, "packed"),
                                   ("float32", 512, 64, 32, None)]:
        w = nbits.random_weights(rng, K, N, block_size=block, dtype=dtype, zero_points=zp, bias=True)
        runner = MatMulRunner(device, w, graph=not device.cpu)
        dev = device
        record = dict(dtype=dtype, K=K, N=N, block=block, zero_points=zp, steps=[])
        ok = True
        buffers = {}
        for graph_id, M in enumerate([1, 5, 16], start=1):
            a = random_a(rng, M, K, dtype)
            a_t, y_t = dev.tensor(a, dtype), dev.full((M, N), dtype, float("nan"))
            binding = runner.session.io_binding()
            dev.bind(binding, "A", a_t)
            dev.bind(binding, "Y", y_t, output=True)
            buffers[M] = (a_t, y_t, binding, graph_id)
            for step in ("first run", "capture or replay", "replay"):
                runner.session.run_with_iobinding(binding, dev.run_options(graph_id))
                r = compare(dev.numpy(y_t), a, w)
                record["steps"].append({"M": M, "step": step, **r})
                ok &= r["ok"]
            a = random_a(rng, M, K, dtype)  # new data into the same buffer, then replay
            a_t.copy_(dev.tensor(a, dtype))
            y_t.fill_(float("nan"))
            runner.session.run_with_iobinding(binding, dev.run_options(graph_id))
            r = compare(dev.numpy(y_t), a, w)
            record["steps"].append({"M": M, "step": "replay after new input", **r})
            ok &= r["ok"]
        # Decode-consistency across graphs: row 0 of the M=5 graph vs the M=1 graph on the same row.
        a1, y1, b1, g1 = buffers[1]
        a5, y5, b5, g5 = buffers[5]
        a1.copy_(a5[0:1])
        runner.session.run_with_iobinding(b1, dev.run_options(g1))
        runner.session.run_with_iobinding(b5, dev.run_options(g5))
        same = bool(np.array_equal(dev.bits(y1)[0], dev.bits(y5)[0]))
        record["row0_M5_equals_M1_bitwise"] = same
        record["ok"] = bool(ok and same)
        record["case"] = case_label(dtype, K, N, 4, block, zp, True)
        if not record["ok"]:
            bad = [f"M={x['M']} {x['step']}" for x in record["steps"] if not x["ok"]]
            record["problem"] = f"failed steps {bad[:4]}" if bad else "row 0 of the M=5 graph differs from the M=1 graph"
        results.append(record)
    return results


# ---------------------------------------------------------------------------------------------------
# CopySlots

def copy_slots_model(specs, out_shapes=None):
    """CopySlots(slots, src_i, dst_i ...) -> out_i for specs [(dtype, src_shape, dst_shape)]."""
    inputs = [helper.make_tensor_value_info("slots", TensorProto.INT64, [2])]
    outputs, names = [], ["slots"]
    for i, (dtype, src_shape, dst_shape) in enumerate(specs):
        elem = TensorProto.BFLOAT16 if dtype == "bfloat16" else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        inputs += [helper.make_tensor_value_info(f"src_{i}", elem, list(src_shape)),
                   helper.make_tensor_value_info(f"dst_{i}", elem, list(dst_shape))]
        outputs.append(helper.make_tensor_value_info(f"out_{i}", elem, list(dst_shape)))
        names += [f"src_{i}", f"dst_{i}"]
    node = helper.make_node("CopySlots", names, [o.name for o in outputs], name="copy_slots", domain="ort_mtp")
    graph = helper.make_graph([node], "copy_slots", inputs, outputs)
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ort_mtp", 1)])


def random_tensor(device: Device, rng, dtype: str, shape):
    torch = device.torch
    if dtype == "bool":
        host = torch.from_numpy(rng.integers(0, 2, size=shape).astype(bool))
    elif dtype in ("int64", "uint8", "int32"):
        host = torch.from_numpy(rng.integers(0, 200, size=shape).astype(dtype))
    else:
        host = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(getattr(torch, dtype))
    return host.to(device.name)


def raw(device: Device, t) -> np.ndarray:
    """The tensor's bytes on the host, leading (slot) axis kept: bit-exact comparison for every dtype."""
    device.synchronize()
    return t.detach().cpu().contiguous().view(device.torch.uint8).numpy().copy()


MIXED = [("float16", (4, 1, 64, 3)), ("float32", (4, 1, 6, 16, 16)), ("bfloat16", (4, 2, 33)),
         ("int64", (4, 5)), ("uint8", (4, 7)), ("bool", (4, 3)), ("float16", (4, 1, 1024, 3)),
         ("float32", (4, 1, 48, 32, 32))]


def run_copy(device: Device, session, slots, pairs, outs) -> None:
    binding = session.io_binding()
    slots_np = np.asarray(slots, dtype=np.int64)
    binding.bind_input("slots", "cpu", 0, np.int64, [2], slots_np.ctypes.data)
    for i, (src, dst) in enumerate(pairs):
        device.bind(binding, f"src_{i}", src)
        device.bind(binding, f"dst_{i}", dst)
        device.bind(binding, f"out_{i}", outs[i], output=True)
    session.run_with_iobinding(binding, device.run_options())
    device.synchronize()


def check_copy_slots(ctx: "Context") -> list[dict]:
    device, rng = ctx.device, ctx.rng
    results = []

    def record(name, ok, **extra):
        results.append({"case": name, "ok": bool(ok), "problem": None if ok else "output differs from numpy", **extra})

    # 1. Promote in place: src = dst = out, slot a -> slot W-1, every dtype in one launch.
    specs = [(dt, shape, shape) for dt, shape in MIXED]
    session = device.session(copy_slots_model(specs))
    for a in range(4):
        bufs = [random_tensor(device, rng, dt, shape) for dt, shape in MIXED]
        before = [raw(device, b) for b in bufs]
        run_copy(device, session, (a, 3), [(b, b) for b in bufs], bufs)
        ok = True
        for b, host in zip(bufs, before):
            expect = host.copy()
            expect[3] = host[a]
            ok &= np.array_equal(raw(device, b), expect)
        record(f"promote in place slot {a}->3", ok, tensors=len(bufs))

    # 2. Slot copy into a separate, poisoned output: window [4, ...] -> committed [1, ...].
    specs = [(dt, shape, (1,) + shape[1:]) for dt, shape in MIXED]
    session = device.session(copy_slots_model(specs))
    srcs = [random_tensor(device, rng, dt, shape) for dt, shape in MIXED]
    dsts = [random_tensor(device, rng, dt, (1,) + shape[1:]) for dt, shape in MIXED]
    outs = [random_tensor(device, rng, dt, (1,) + shape[1:]) for dt, shape in MIXED]  # "poison": random
    dst_before = [raw(device, d) for d in dsts]
    run_copy(device, session, (2, 0), list(zip(srcs, dsts)), outs)
    ok = all(np.array_equal(raw(device, o), raw(device, s)[2:3]) for o, s in zip(outs, srcs))
    ok &= all(np.array_equal(raw(device, d), h) for d, h in zip(dsts, dst_before))  # inputs untouched
    record("slot 2 -> 0 into separate outputs", ok, tensors=len(srcs))

    # 3. Whole copies (-1, -1) into separate outputs.
    specs = [(dt, shape, shape) for dt, shape in MIXED]
    session = device.session(copy_slots_model(specs))
    srcs = [random_tensor(device, rng, dt, shape) for dt, shape in MIXED]
    dsts = [random_tensor(device, rng, dt, shape) for dt, shape in MIXED]
    outs = [random_tensor(device, rng, dt, shape) for dt, shape in MIXED]
    run_copy(device, session, (-1, -1), list(zip(srcs, dsts)), outs)
    ok = all(np.array_equal(raw(device, o), raw(device, s)) for o, s in zip(outs, srcs))
    record("whole copy into separate outputs", ok, tensors=len(srcs))

    # 4. Many tensors (two launches' worth of ranges), in place.
    many = [("float16", (4, 100 + i)) for i in range(150)]
    session = device.session(copy_slots_model([(dt, s, s) for dt, s in many]))
    bufs = [random_tensor(device, rng, dt, s) for dt, s in many]
    before = [raw(device, b) for b in bufs]
    run_copy(device, session, (1, 3), [(b, b) for b in bufs], bufs)
    ok = True
    for b, host in zip(bufs, before):
        expect = host.copy()
        expect[3] = host[1]
        ok &= np.array_equal(raw(device, b), expect)
    record("150 tensors in place", ok, tensors=len(bufs))

    # 5. In place under ORT's CUDA graph: capture, then replay on new buffer contents.
    specs = [(dt, shape, shape) for dt, shape in MIXED]
    session = device.session(copy_slots_model(specs), graph=not device.cpu)
    bufs = [random_tensor(device, rng, dt, shape) for dt, shape in MIXED]
    binding = session.io_binding()
    slots_np = np.asarray((1, 3), dtype=np.int64)
    binding.bind_input("slots", "cpu", 0, np.int64, [2], slots_np.ctypes.data)
    for i, b in enumerate(bufs):
        device.bind(binding, f"src_{i}", b)
        device.bind(binding, f"dst_{i}", b)
        device.bind(binding, f"out_{i}", b, output=True)
    ok = True
    steps = []
    for step in range(3):
        fresh = [random_tensor(device, rng, dt, shape) for dt, shape in MIXED]
        for b, f in zip(bufs, fresh):
            b.copy_(f)
        before = [raw(device, b) for b in bufs]
        session.run_with_iobinding(binding, device.run_options(1))
        device.synchronize()
        good = True
        for b, host in zip(bufs, before):
            expect = host.copy()
            expect[3] = host[1]
            good &= np.array_equal(raw(device, b), expect)
        steps.append(bool(good))
        ok &= good
    record("in place under CUDA graph (capture + replays)", ok, steps=steps)
    return results


# ---------------------------------------------------------------------------------------------------

@dataclass
class Group:
    name: str
    what: str
    smoke: bool                      # part of --smoke
    env: dict = field(default_factory=dict)


GROUPS = [
    Group("smoke-mma", "tensor-core kernel, one K-part: fp16/bf16 x block 32/64/128/256 x zero points "
          "none/packed x 8/16 tokens, KC 128/256/512, 1-4 m-tiles per block", True),
    Group("smoke-mma-kparts", "tensor-core kernel split over K into 2..16 K-parts (warps of one block)", True),
    Group("smoke-mma-wide", "tensor-core kernel on layer-like cuts: many blocks, several waves, K-parts x "
          "m-tiles", True),
    Group("smoke-plain", "tensor-core kernel without programmatic dependent launch (ORT_MTP_GEMV_PDL=0)", True,
          {"ORT_MTP_GEMV_PDL": "0"}),
    Group("smoke-simt", "CUDA-core fallback kernel (ORT_MTP_GEMV_VARIANT=simt), 1/2/4/8-token templates", True,
          {"ORT_MTP_GEMV_VARIANT": "simt"}),
    Group("smoke-generic", "general kernel: fp32, 8 bits, typed zero points, block 16, K % block != 0", True),
    Group("smoke-tiles", "tiles kernel (packing=1, weights packed by ops.packing): fp16/bf16 x block 32/64/128, "
          "K-parts, waves, two-shape cuts", True),
    Group("copy_slots", "CopySlots: promote in place, slot and whole copies, 150 tensors, CUDA graph", True),
    Group("matmul", "fixed coverage list + random cases vs the float64 reference and our CPU op", False),
    Group("decode", "rows bit-identical across M = 1..16, 17, 24, 33, 40 (default kernels)", False),
    Group("decode-simt", "rows bit-identical across M on the simt kernel", False, {"ORT_MTP_GEMV_VARIANT": "simt"}),
    Group("graph", "capture and replay under ORT's CUDA graph (PDL launches, the default), new data into "
          "bound buffers", False),
    Group("graph-plain", "the same with plain launches and copies", False, {"ORT_MTP_GEMV_PDL": "0"}),
]
GROUP_BY_NAME = {g.name: g for g in GROUPS}
ENV_KEYS = ("ORT_MTP_GEMV_VARIANT", "ORT_MTP_GEMV_PDL")
SANITIZER_EXIT = 86  # compute-sanitizer --error-exitcode: the tool found an error
# Errors after which the CUDA context is unusable: every later call in the process fails the same way.
STICKY = re.compile(r"CUDA failure|CUDA error|illegal|cudaError|launch failure|unspecified", re.IGNORECASE)


class Context:
    """What a group's checks need: the device, a seeded generator, the kernel variant for labels."""

    def __init__(self, device: Device, seed: int, env: dict):
        self.device = device
        self.rng = np.random.default_rng(seed)
        self.variant = env.get("ORT_MTP_GEMV_VARIANT", "mma")
        self.pdl = env.get("ORT_MTP_GEMV_PDL", "1") == "1"

    def path(self, dtype, bits, block, zp, K, N, tiles: bool = False) -> str:
        path = expected_path(dtype, bits, block, zp, K, N, "tiles" if tiles else self.variant)
        return path + ("+pdl" if self.pdl and path.startswith("mma") else "")


def group_records(name: str, ctx: Context, args):
    """The group's checks as an iterable of records."""
    if name.startswith("smoke-"):
        kind = name[len("smoke-"):]
        return check_smoke(ctx, SMOKE_CASES[kind], tiles=kind == "tiles")
    if name == "matmul":
        return check_matmul(ctx, args.random_cases)
    if name in ("decode", "decode-simt"):
        return check_decode_consistency(ctx)
    if name in ("graph", "graph-plain"):
        return check_graph(ctx)
    if name == "copy_slots":
        return check_copy_slots(ctx)
    raise BenchError(f"unknown group {name!r}")


def run_worker(args) -> int:
    """One group in this process; the result JSON is rewritten after every record, so a crash keeps
    what ran before it."""
    group = GROUP_BY_NAME[args.worker]
    out = Path(args.result)
    report = {"group": group.name, "env": {k: os.environ[k] for k in ENV_KEYS if os.environ.get(k)},
              "records": [], "started": time.time()}

    def save():
        report["seconds"] = round(time.time() - report["started"], 1)
        out.write_text(json.dumps(report, indent=1, default=str))

    save()
    device = Device(cpu=args.cpu_dry_run)
    report["info"] = device_info(device)
    ctx = Context(device, args.seed, report["env"])
    save()
    try:
        for record in group_records(group.name, ctx, args):
            report["records"].append(record)
            save()
    except Exception as e:  # noqa: BLE001  (recorded, with its traceback, as the group's failure)
        message = f"{type(e).__name__}: {e}"
        report["records"].append({"case": "(exception)", "ok": False, "problem": message[:2000],
                                  "traceback": traceback.format_exc()[-3000:]})
        report["aborted"] = True  # the group's remaining cases did not run
        report["sticky_cuda_error"] = bool(STICKY.search(message))
    save()
    return 0


def sanitizer_command(tool: str, explicit: str | None) -> list[str]:
    exe = explicit or shutil.which("compute-sanitizer")
    if not exe:
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        candidate = Path(cuda_home) / "bin" / "compute-sanitizer"
        exe = str(candidate) if candidate.is_file() else None
    if not exe:
        raise BenchError("compute-sanitizer not found: put it on PATH, set CUDA_HOME or pass --sanitizer-path")
    # API errors are not reported: ONNX Runtime and cuDNN make calls that fail by design (probing), and
    # only our kernels are under test here.
    return [exe, "--tool", tool, "--error-exitcode", str(SANITIZER_EXIT), "--print-limit", "20",
            "--report-api-errors", "no"]


SANITIZER_LINE = re.compile(r"^=+ (?!ERROR SUMMARY|COMPUTE-SANITIZER|Program hit|\s*Saved host backtrace|\s+at |\s+Host Frame)(.+)")


def first_sanitizer_error(log: str) -> str | None:
    """The first report of compute-sanitizer in a log (with the next two lines: kernel and place)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = SANITIZER_LINE.match(line)
        if m and re.search(r"Invalid|Error|error|Race|Hazard|hazard|Illegal|Misaligned|Out of bounds|Barrier",
                           m.group(1)):
            extra = [re.sub(r"^=+\s*", "", x).strip() for x in lines[i + 1:i + 3] if x.startswith("=")]
            return " | ".join([m.group(1).strip()] + [x for x in extra if x])[:600]
    return None


def sanitizer_error_count(log: str) -> int | None:
    """Errors compute-sanitizer reported (racecheck counts its hazards apart from the error summary)."""
    counts = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", log)]
    counts += [int(n) for n in re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", log)]
    return sum(counts) if counts else None


_running: set[subprocess.Popen] = set()  # workers now running, killed with their process groups on SIGTERM
_running_lock = threading.Lock()


def _kill_running(signum, frame):  # noqa: ARG001
    with _running_lock:
        for proc in list(_running):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    sys.exit(128 + signum)


def run_in_own_group(cmd: list[str], env: dict, timeout: int) -> tuple[int | None, str]:
    """Runs cmd in a new process group (compute-sanitizer starts the worker as its own child: killing
    the group leaves nothing behind on the GPU). Returns (exit status or None on timeout, output)."""
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        with _running_lock:
            _running.add(proc)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return None, out
        finally:
            with _running_lock:
                _running.discard(proc)


def run_group(group: Group, args, logs: Path, scratch: Path) -> dict:
    result_path = scratch / f"{group.name}.json"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", group.name, "--result", str(result_path),
           "--seed", str(args.seed), "--random-cases", str(args.random_cases)]
    if args.cpu_dry_run:
        cmd.append("--cpu-dry-run")
    if args.sanitizer:
        cmd = sanitizer_command(args.sanitizer, args.sanitizer_path) + cmd
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env.update(group.env)
    env["PYTHONUNBUFFERED"] = "1"
    if args.sanitizer:  # torch buffers (A, Y) from cudaMalloc one by one, so memcheck sees their exact ends
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    started = time.time()
    rc, log = run_in_own_group(cmd, env, args.group_timeout)
    seconds = round(time.time() - started, 1)
    (logs / f"{group.name}.log").write_text(log)
    worker = json.loads(result_path.read_text()) if result_path.exists() else {}
    records = worker.get("records", [])
    failed = [r for r in records if not r.get("ok")]
    first_error = failed[0].get("problem") if failed else None
    if first_error and failed[0].get("case"):
        first_error = f"{failed[0]['case']}: {first_error}"
    res = {"group": group.name, "what": group.what, "env": group.env, "returncode": rc, "seconds": seconds,
           "cases": len(records), "failed": len(failed), "first_error": first_error, "records": records,
           "info": worker.get("info")}
    if rc is None:
        res["first_error"] = res["first_error"] or f"timed out after {args.group_timeout}s"
        res["timed_out"] = True
    if args.sanitizer:
        res["sanitizer_errors"] = sanitizer_error_count(log)
        found = first_sanitizer_error(log)
        if rc == SANITIZER_EXIT or (res["sanitizer_errors"] or 0) > 0:
            res["sanitizer_first_error"] = found
            res["first_error"] = res["first_error"] or f"{args.sanitizer}: {found}"
    if not records and not res["first_error"]:
        tail = [x for x in log.strip().splitlines() if x.strip()][-3:]
        res["first_error"] = f"worker ended (rc {rc}) without a result: {' | '.join(tail)[-500:]}"
    sanitizer_bad = bool(args.sanitizer and (rc == SANITIZER_EXIT or (res.get("sanitizer_errors") or 0) > 0))
    res["ok"] = bool(records) and not failed and rc == 0 and not sanitizer_bad
    if not res["ok"] and not res["first_error"]:
        res["first_error"] = f"worker exit status {rc}"
    return res


def summary_table(report: dict) -> str:
    lines = [f"{'group':<20}{'cases':>6}{'failed':>8}{'sec':>7}  result / first error"]
    for g in report["groups"]:
        verdict = "PASS" if g["ok"] else "FAIL " + (g.get("first_error") or "")[:240]
        lines.append(f"{g['group']:<20}{g['cases']:>6}{g['failed']:>8}{g['seconds']:>7.0f}  {verdict}")
    worst = max((r.get("cuda", r.get("accuracy", {})).get("max_err_over_tol", 0.0)
                 for g in report["groups"] for r in g["records"] if isinstance(r.get("cuda", r.get("accuracy")), dict)),
                default=0.0)
    lines.append(f"worst MatMulNBits error / tolerance over all groups: {worst:.3f}")
    lines.append("ALL PASSED" if report["passed"] else "SOME CHECKS FAILED")
    return "\n".join(lines)


def list_groups() -> str:
    return "\n".join(f"{g.name:<20}{'smoke' if g.smoke else 'full ':<7}{g.what}"
                     + (f"  [{' '.join(f'{k}={v}' for k, v in g.env.items())}]" if g.env else "") for g in GROUPS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the checks on the CPU EP (no GPU)")
    parser.add_argument("--out", help="result folder (default: $OUT, else bench/results)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--random-cases", type=int, default=24, help="random cases of the 'matmul' group")
    parser.add_argument("--smoke", action="store_true", help="only the smoke groups (one tiny case per kernel path)")
    parser.add_argument("--groups", help="comma list of groups to run (see --list)")
    parser.add_argument("--list", action="store_true", help="list the groups and exit")
    parser.add_argument("--sanitizer", choices=["memcheck", "racecheck", "synccheck", "initcheck"],
                        help="run each group's worker under compute-sanitizer with this tool")
    parser.add_argument("--sanitizer-path", help="compute-sanitizer executable (default: PATH, then $CUDA_HOME/bin)")
    parser.add_argument("--group-timeout", type=int, default=300, help="seconds one group may take")
    parser.add_argument("--jobs", type=int, default=1,
                        help="groups run at once (their workers are separate processes on the one GPU; most of "
                             "a group's time is host work: reference sums, process start)")
    parser.add_argument("--scratch", default="/tmp/ort_mtp_check", help="where workers write their results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--small", action="store_true", help=argparse.SUPPRESS)  # old name of --smoke
    args = parser.parse_args(argv)
    try:
        if args.list:
            print(list_groups())
            return 0
        if args.seed is None:
            args.seed = int(time.time()) % 100000
        if args.worker:
            if args.worker not in GROUP_BY_NAME:
                raise BenchError(f"unknown group {args.worker!r}")
            return run_worker(args)
        if args.random_cases < 0 or args.group_timeout <= 0 or args.jobs < 1:
            raise BenchError("--random-cases must be >= 0, --group-timeout > 0 and --jobs >= 1")
        smoke = args.smoke or args.small
        if args.groups:
            names = [n.strip() for n in args.groups.split(",") if n.strip()]
            unknown = [n for n in names if n not in GROUP_BY_NAME]
            if unknown:
                raise BenchError(f"unknown groups {unknown}; --list shows them")
            chosen = [GROUP_BY_NAME[n] for n in names]
        else:
            chosen = [g for g in GROUPS if g.smoke or not smoke]
        if args.sanitizer and args.cpu_dry_run:
            raise BenchError("--sanitizer needs the GPU: drop --cpu-dry-run")
        if args.sanitizer:
            sanitizer_command(args.sanitizer, args.sanitizer_path)  # fail early when it is missing
        name = "check_cuda_ops" + ("_smoke" if smoke else "") + \
            (f"_{args.sanitizer}" if args.sanitizer else "")
        out = out_dir(args.out)
        logs = out / f"{name}_logs"
        logs.mkdir(parents=True, exist_ok=True)
        scratch = Path(args.scratch) / name
        scratch.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, _kill_running)
        started = time.time()
        report = {"seed": args.seed, "sanitizer": args.sanitizer, "groups": []}
        print(f"check_cuda_ops: {len(chosen)} groups, seed {args.seed}"
              + (f", under compute-sanitizer --tool {args.sanitizer}" if args.sanitizer else ""), flush=True)
        def finished(res):
            print(f"{'PASS' if res['ok'] else 'FAIL'} {res['group']}: {res['cases']} cases, {res['failed']} failed, "
                  f"{res['seconds']:.0f}s" + ("" if res["ok"] else f"; first error: {res['first_error']}"), flush=True)
            return res

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # results kept in the groups' order
            futures = [pool.submit(lambda g: finished(run_group(g, args, logs, scratch)), g) for g in chosen]
            for future in futures:
                res = future.result()
                report["groups"].append(res)
                report.setdefault("info", res.get("info"))
        report["passed"] = all(g["ok"] for g in report["groups"])
        report["seconds"] = round(time.time() - started, 1)
        path = out / f"{name}.json"
        path.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {path} (logs in {logs})")
        print(summary_table(report))
        return 0 if report["passed"] else 1
    except BenchError as e:
        print(f"check_cuda_ops: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
