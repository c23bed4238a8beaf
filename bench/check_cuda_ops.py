"""Device correctness check of the CUDA paths of ort_mtp::MatMulNBits and ort_mtp::CopySlots.

    python bench/check_cuda_ops.py                 # on the GPU machine (about a minute)
    python bench/check_cuda_ops.py --cpu-dry-run   # the same logic on the CPU EP (tests the script)
    compute-sanitizer --tool memcheck python bench/check_cuda_ops.py --small --random-cases 4
    compute-sanitizer --tool racecheck python bench/check_cuda_ops.py --small --random-cases 0

Builds nothing: the library comes from ops.library_path() (ORT_MTP_LIBRARY overrides). Writes
check_cuda_ops.json to --out, else $OUT, else bench/results; prints a summary table last; exits
non-zero when any check fails.

MatMulNBits, every case with fresh random data (A, B, scales, zero points, bias):
  * CUDA output vs the float64 reference (ops.nbits.reference) and vs our CPU op, over fp16 / bf16 /
    fp32, block sizes 16..256, zero points absent / packed / typed, bias, odd N, K % block != 0,
    8 bits, M = 1..16 and large M. Tolerance per element: 1 ulp of the output type at |ref| (the
    final rounding, plus a flipped rounding) + 2^-24 * (K/16 + 64) * magnitude (fp32 accumulation:
    one rounding per mma k-step / lane group and per block; magnitude = sum |a| |scale| (|q|+|zp|)).
    The output buffer is poisoned with NaN before each run, so an unwritten element fails.
  * decode-consistency: row i of an M-row call is bit-identical to the M=1 call on row i alone, for
    M = 1..16, 17, 24, 33, 40, on each kernel path.
  * ORT's CUDA graph (enable_cuda_graph=1, one gpu_graph_id per M): capture, replay, replay after new
    data is written into the bound input buffer.
CopySlots: slot promote in place (outputs bound to the destination buffers), slot copy and whole
copy into separate (poisoned) outputs, many tensors (more than one launch's worth), mixed dtypes and
odd byte counts, and in place under ORT's CUDA graph; each compared bit-exactly with numpy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import numpy as np
from onnx import TensorProto, helper

from ort_device import BenchError, Device, device_info, out_dir

from ops import nbits  # noqa: E402  (ort_device put the checkout on sys.path)

MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23}
MIN_EXP = {"float16": -14, "bfloat16": -126, "float32": -126}


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of `dtype` values at |x| (subnormal spacing below the normal range)."""
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** MIN_EXP[dtype])))
    return 2.0 ** (e - MANTISSA[dtype])


def expected_path(dtype: str, bits: int, block: int, zp: str | None, K: int, N: int, sms: int = 132) -> str:
    """Which CUDA kernel the op picks (mirrors PlanMma in matmul_nbits_cuda.cu; for the report)."""
    if dtype == "float32" or bits != 4 or zp == "typed" or block not in (32, 64, 128, 256):
        return "generic"
    kc = (256 if K % 256 == 0 else 128 if K % 128 == 0 else 0) if block <= 64 else (2 * block if K % (2 * block) == 0 else 0)
    if not kc:
        return "generic"
    tiles, kchunks, splits = -(-N // 128), K // kc, 1
    while splits < 8 and tiles * splits < sms and kchunks >= 4 * splits:
        splits *= 2
    return f"mma(kc={kc},splits={splits})"


def random_a(rng, M: int, K: int, dtype: str) -> np.ndarray:
    return nbits.round_to(rng.uniform(-1.0, 1.0, size=(M, K)), dtype)


class MatMulRunner:
    """One weight set as a single-node ort_mtp model, on the device under test and on the CPU EP."""

    def __init__(self, device: Device, w: nbits.NBitsWeights, graph: bool = False):
        self.device, self.w = device, w
        model = nbits.single_node_model(w, domain="ort_mtp", a_shape=("M", None))
        self.session = device.session(model, graph=graph)
        self.cpu_session = device.session(model, cpu=True) if not graph else None

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


SMALL = 2_000_000  # --small: at most this many weights per case (for compute-sanitizer runs)


def check_matmul(device: Device, rng, n_random: int, small: bool = False) -> list[dict]:
    results = []
    for dtype, K, N, bits, block, zp, bias in COVERAGE + random_cases(rng, n_random):
        if small and K * N > SMALL:
            continue
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(device, w)
        ms = sorted({1, 16, int(rng.integers(2, 16)), int(rng.choice([17, 33] if small else [17, 33, 100, 517]))})
        for M in ms:
            a = random_a(rng, M, K, dtype)
            y = device.numpy(runner.run(a))
            y_cpu = device.numpy(runner.run(a, cpu=True))
            r = compare(y, a, w)
            r_cpu = compare(y_cpu, a, w)
            diff_ulps = float(np.max(np.abs(y - y_cpu) / ulp(y_cpu, dtype))) if y.size else 0.0
            results.append(dict(dtype=dtype, K=K, N=N, bits=bits, block=block, zero_points=zp, bias=bias, M=M,
                                path=expected_path(dtype, bits, block, zp, K, N), cuda=r, cpu_op=r_cpu,
                                max_diff_vs_cpu_op_ulps=diff_ulps, ok=r["ok"] and r_cpu["ok"]))
    return results


DECODE = [  # dtype, K, N, bits, block, zero points, bias
    ("float16", 2048, 5120, 4, 32, None, False),     # cluster split 4
    ("bfloat16", 1024, 2000, 4, 32, "packed", True),  # split 2, packed zero points
    ("float16", 640, 129, 4, 64, None, False),       # kc 128
    ("bfloat16", 1024, 300, 4, 128, None, True),
    ("float16", 2048, 300, 4, 256, "packed", False),
    ("float16", 512, 20000, 4, 32, None, False),     # many row tiles, no split
    ("float32", 1000, 70, 4, 32, "typed", True),     # general kernel
    ("float16", 512, 90, 8, 32, None, False),        # general kernel, 8 bits
]
DECODE_MS = list(range(1, 17)) + [17, 24, 33, 40]


def check_decode_consistency(device: Device, rng, small: bool = False) -> list[dict]:
    results = []
    ms_list = [1, 5, 16, 17] if small else DECODE_MS
    for dtype, K, N, bits, block, zp, bias in DECODE:
        if small and K * N > SMALL:
            continue
        w = nbits.random_weights(rng, K, N, bits=bits, block_size=block, dtype=dtype, zero_points=zp, bias=bias)
        runner = MatMulRunner(device, w)
        a = random_a(rng, max(ms_list), K, dtype)
        single = [device.bits(runner.run(np.ascontiguousarray(a[i:i + 1])))[0] for i in range(a.shape[0])]
        bad = []
        for M in ms_list:
            y = device.bits(runner.run(np.ascontiguousarray(a[:M])))
            rows = [i for i in range(M) if not np.array_equal(y[i], single[i])]
            if rows:
                bad.append({"M": M, "rows": rows[:8], "count": len(rows)})
        full = compare(device.numpy(runner.run(np.ascontiguousarray(a))), a, w)
        results.append(dict(dtype=dtype, K=K, N=N, bits=bits, block=block, zero_points=zp, bias=bias,
                            path=expected_path(dtype, bits, block, zp, K, N), Ms=ms_list, mismatches=bad,
                            accuracy_at_max_M=full, ok=not bad and full["ok"]))
    return results


def check_graph(device: Device, rng) -> list[dict]:
    """CUDA graph capture/replay of the op, one graph per M, fresh data written into bound buffers."""
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


def check_copy_slots(device: Device, rng) -> list[dict]:
    results = []

    def record(name, ok, **extra):
        results.append({"case": name, "ok": bool(ok), **extra})

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

def summary_table(report: dict) -> str:
    lines = ["check                              cases  failed"]

    def row(name, items):
        failed = sum(1 for r in items if not r["ok"])
        lines.append(f"{name:<34} {len(items):>5}  {failed:>6}")

    row("MatMulNBits vs reference/CPU op", report["matmul"])
    for path in sorted({r["path"].split("(")[0] for r in report["matmul"]}):
        row(f"  path {path}", [r for r in report["matmul"] if r["path"].startswith(path)])
    row("MatMulNBits rows bit-identical in M", report["decode"])
    row("MatMulNBits under CUDA graph", report["graph"])
    row("CopySlots", report["copy_slots"])
    worst = max((r.get("cuda", {}).get("max_err_over_tol", 0.0) for r in report["matmul"]), default=0.0)
    lines.append(f"worst MatMulNBits error / tolerance: {worst:.3f}")
    for section in ("matmul", "decode", "graph", "copy_slots"):
        for r in report[section]:
            if not r["ok"]:
                lines.append(f"FAILED {section}: " + json.dumps({k: v for k, v in r.items() if k != 'steps'})[:300])
    lines.append("ALL PASSED" if report["passed"] else "SOME CHECKS FAILED")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the checks on the CPU EP (no GPU)")
    parser.add_argument("--out", help="result folder (default: $OUT, else bench/results)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--random-cases", type=int, default=40, help="random MatMulNBits cases besides the fixed ones")
    parser.add_argument("--small", action="store_true",
                        help="only cases of <= 2M weights and fewer M (for runs under compute-sanitizer)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    try:
        device = Device(cpu=args.cpu_dry_run)
        rng = np.random.default_rng(seed)
        report = {"seed": seed, "info": device_info(device)}
        started = time.time()
        sections = [("matmul", lambda: check_matmul(device, rng, args.random_cases, args.small)),
                    ("decode", lambda: check_decode_consistency(device, rng, args.small)),
                    ("graph", lambda: check_graph(device, rng)),
                    ("copy_slots", lambda: check_copy_slots(device, rng))]
        for name, fn in sections:
            try:
                report[name] = fn()
            except Exception as e:  # keep the other sections' results; the failure is recorded
                report[name] = [{"ok": False, "path": "error", "error": f"{type(e).__name__}: {e}",
                                 "traceback": traceback.format_exc()[-2000:]}]
            print(f"{name}: {len(report[name])} checks, {sum(not r['ok'] for r in report[name])} failed, "
                  f"{time.time() - started:.0f}s", flush=True)
        report["passed"] = all(r["ok"] for s in ("matmul", "decode", "graph", "copy_slots") for r in report[s])
        report["seconds"] = round(time.time() - started, 1)
        path = out_dir(args.out) / "check_cuda_ops.json"
        path.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {path}")
        print(summary_table(report))
        return 0 if report["passed"] else 1
    except BenchError as e:
        print(f"check_cuda_ops: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
