"""int4 MatMulNBits on the GPU: ORT's default kernel, ORT's fpA_intB kernel and ours, same weights,
same inputs, each under ORT's CUDA graph; the device copy ceiling measured in the same run; and the
cost of CopySlots on the 27B model's linear-attention state.

    python bench/gemv.py                 # on the GPU machine (about 2-3 minutes)
    python bench/gemv.py --cpu-dry-run   # tiny shapes on the CPU EP: tests the script's logic

Writes gemv.json to --out, else $OUT, else bench/results; prints a summary table and the GEMV's
targets last, scored for our default path and, when it ran, for the tiles path (ours_tiles).

Workloads (int4, block 32, fp16, no zero points, fresh random non-zero data; weights written once to
/tmp as external data shared by every implementation's model):
  chain      4 x (5120 -> 17408, 17408 -> 5120), each node feeding the next (401 MB)
  27B shapes q_proj 5120->12288, k/v_proj 5120->1024, o_proj = linear-attention out_proj 6144->5120,
             linear-attention in_proj_qkv 5120->10240 and in_proj_z 5120->6144, gate/up 5120->17408,
             down 17408->5120: L independent nodes with their own weights (L x bytes ~ 256 MB, so the
             weights stream from HBM, not the 60 MB L2), all reading the same A
  lm_head    5120 -> 248320 (715 MB), one node
M = 1, 2, 3, 4, 6, 8, 12, 16. Every implementation runs in its own process (ORT_FPA_INTB_GEMM and
ORT_MTP_GEMV_* are read once per process), on the driver's CUDA device (driver/device.py: CuPy buffers,
one stream shared with ORT); a measurement is the median over 7 samples of back-to-back graph replays
timed with CUDA events on that stream (host not waiting between replays; the JSON also has the host's
time per call, 4-13 us on the chain, and --prefill keeps the GPU busy while the host queues each
sample: it made no difference, lab/NOTES.md lab run 42). GB/s counts weight + scale bytes. Before
timing, each process saves its outputs for the same A; the parent checks ours against a float64
reference (sampled columns) and against ORT's default kernel, and that our rows are bit-identical
across M. --prefill's busy kernel is compiled by CuPy (NVRTC) on first use (bench/gpu_timing.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # ops and driver from the checkout when they are not pip-installed

import ops  # noqa: E402
from driver.device import bind, bind_host, describe, make_device, make_session  # noqa: E402
from driver.errors import DriverError  # noqa: E402
from gpu_timing import busy_kernel, copy_ceiling, host_seconds_per_call, out_dir  # noqa: E402
from ops import packing  # noqa: E402
from ops.copy_slots import copy_slots_model  # noqa: E402

MS = [1, 2, 3, 4, 6, 8, 12, 16]
BLOCK = 32
TARGET_BYTES = 256e6  # per timed run of a single-shape workload
SAMPLE_COLUMNS = 1024  # output columns kept for the correctness comparison

TILES_MODEL = "tiles"  # the ort_mtp model on weights packed by ops.packing (packing=1)
IMPLS = {  # name -> (model: node domain or TILES_MODEL, environment)
    "ort": ("com.microsoft", {}),
    "ort_fpa_intb": ("com.microsoft", {"ORT_FPA_INTB_GEMM": "1"}),
    "ours": (ops.DOMAIN, {"ORT_MTP_GEMV_VARIANT": "mma", "ORT_MTP_GEMV_PDL": "1"}),
    "ours_tiles": (TILES_MODEL, {"ORT_MTP_GEMV_PDL": "1"}),
    "ours_nopdl": (ops.DOMAIN, {"ORT_MTP_GEMV_VARIANT": "mma", "ORT_MTP_GEMV_PDL": "0"}),
    "ours_generic": (ops.DOMAIN, {"ORT_MTP_GEMV_VARIANT": "generic"}),
}
DEFAULT_IMPLS = ["ort", "ort_fpa_intb", "ours", "ours_tiles"]
ENV_KEYS = ("ORT_FPA_INTB_GEMM", "ORT_MTP_GEMV_VARIANT", "ORT_MTP_GEMV_PDL")


class BenchError(RuntimeError):
    """A setup problem reported as one line (no traceback) by main()."""


def open_device(dry: bool):
    """The driver's CUDA device (CuPy, one stream shared with ORT), or its CPU device for a dry run."""
    try:
        return make_device("cpu" if dry else "cuda", graph_capture=False)
    except DriverError as e:
        raise BenchError(f"{e} (or pass --cpu-dry-run)") from None


def device_info(device) -> dict:
    info = describe(device)
    try:
        info["library"] = ops.library_path()
    except ops.LibraryNotFoundError as e:
        raise BenchError(str(e)) from None
    for key in ("ORT_MTP_GEMV_VARIANT", "ORT_MTP_GEMV_PDL", "ORT_FPA_INTB_GEMM"):
        if os.environ.get(key):
            info[key] = os.environ[key]
    return info


def free_device_memory(device) -> None:
    if device.name == "cuda":
        device.xp.get_default_memory_pool().free_all_blocks()


def workloads(dry: bool) -> list[dict]:
    """name, kind (chain | parallel), per-node (K, N)."""
    if dry:
        return [dict(name="chain", kind="chain", nodes=[(256, 512), (512, 256)] * 2),
                dict(name="q_proj", kind="parallel", shape=(256, 384)),
                dict(name="lm_head", kind="parallel", shape=(256, 2000), copies=1)]
    singles = [("q_proj", (5120, 12288)), ("k_proj", (5120, 1024)), ("o_proj", (6144, 5120)),
               ("in_proj_qkv", (5120, 10240)), ("in_proj_z", (5120, 6144)), ("gate_up", (5120, 17408)),
               ("down", (17408, 5120))]
    out = [dict(name="chain", kind="chain", nodes=[(5120, 17408), (17408, 5120)] * 4)]
    out += [dict(name=name, kind="parallel", shape=shape) for name, shape in singles]
    out.append(dict(name="lm_head", kind="parallel", shape=(5120, 248320), copies=1))
    return out


def node_bytes(K: int, N: int) -> tuple[int, int]:
    k_blocks = K // BLOCK
    return N * k_blocks * BLOCK // 2, N * k_blocks * 2  # packed weights, fp16 scales


# ---------------------------------------------------------------------------------------------------
# Weights on disk (written once by the parent, read by every worker's session)

def _external(name: str, dims, elem: int, location: str, offset: int, length: int) -> onnx.TensorProto:
    t = onnx.TensorProto()
    t.name, t.data_type = name, elem
    t.dims.extend(dims)
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def write_workload(folder: Path, w: dict, seed: int, tiles: bool = False) -> dict:
    """Writes weights.bin plus one model per node domain (tiles: also weights_tiles.bin, the same
    weights packed by ops.packing, at the same offsets, and its model); returns the workload's plan
    entry."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if w["kind"] == "chain":
        nodes = list(w["nodes"])
    else:
        K, N = w["shape"]
        weight, scale = node_bytes(K, N)
        copies = w.get("copies") or max(1, min(64, round(TARGET_BYTES / (weight + scale))))
        nodes = [(K, N)] * copies
    offsets, offset = [], 0
    with open(folder / "weights.bin", "wb") as f, \
            (open(folder / "weights_tiles.bin", "wb") if tiles else contextlib.nullcontext()) as ft:
        for K, N in nodes:
            k_blocks = K // BLOCK
            b = np.frombuffer(rng.bytes(N * k_blocks * BLOCK // 2), dtype=np.uint8)
            # |scale| ~ 1 / (5.3 sqrt(K)) keeps RMS(Y) ~ RMS(A) (q - 8 has RMS ~4.6), so a chain stays O(1).
            scales = (rng.uniform(0.5, 1.5, size=N * k_blocks) * rng.choice([-1.0, 1.0], size=N * k_blocks)
                      / (5.3 * math.sqrt(K))).astype(np.float16)
            packed = {}
            if tiles:
                packed = {"B": packing.pack_b(b, N, K), "scales": packing.pack_scales(scales, N, K, BLOCK)}
            entry = {}
            for key, data in (("B", b), ("scales", scales)):
                pad = (-offset) % 65536
                for out, values in ((f, data), (ft, packed.get(key))):
                    if values is not None:
                        out.write(b"\0" * pad)
                        out.write(values.tobytes())
                offset += pad
                entry[key] = (offset, data.nbytes)
                offset += data.nbytes
            offsets.append(entry)
    models = {}
    for domain in ("com.microsoft", ops.DOMAIN):
        models[domain] = str(folder / f"model_{domain.replace('.', '_')}.onnx")
        onnx.save(_graph(w["kind"], nodes, offsets, domain), models[domain])
    if tiles:
        models[TILES_MODEL] = str(folder / "model_tiles.onnx")
        onnx.save(_graph(w["kind"], nodes, offsets, ops.DOMAIN, "weights_tiles.bin", packing=1), models[TILES_MODEL])
    weight_bytes = sum(sum(node_bytes(K, N)) for K, N in nodes)
    K0, N_last = nodes[0][0], nodes[-1][1]
    return dict(name=w["name"], kind=w["kind"], nodes=nodes, K=K0, N=N_last, bytes_per_run=weight_bytes,
                models=models, weights=str(folder / "weights.bin"), offsets=offsets)


def _graph(kind: str, nodes, offsets, domain: str, data: str = "weights.bin", **attrs) -> onnx.ModelProto:
    inits, graph_nodes, outputs = [], [], []
    K0 = nodes[0][0]
    x = "A"
    for i, ((K, N), entry) in enumerate(zip(nodes, offsets)):
        k_blocks = K // BLOCK
        inits.append(_external(f"B{i}", [N, k_blocks, BLOCK // 2], TensorProto.UINT8, data, *entry["B"]))
        inits.append(_external(f"scales{i}", [N, k_blocks], TensorProto.FLOAT16, data, *entry["scales"]))
        y = f"Y{i}" if kind == "parallel" or i == len(nodes) - 1 else f"h{i}"
        graph_nodes.append(helper.make_node("MatMulNBits", [x if kind == "chain" else "A", f"B{i}", f"scales{i}"],
                                            [y], name=f"matmul{i}", domain=domain, K=K, N=N, bits=4, block_size=BLOCK,
                                            **attrs))
        if kind == "parallel" or i == len(nodes) - 1:
            outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT16, ["M", N]))
        x = y
    graph = helper.make_graph(graph_nodes, "gemv_bench", [helper.make_tensor_value_info("A", TensorProto.FLOAT16, ["M", K0])],
                              outputs, initializer=inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid(domain, 1)])


def activations(K: int, seed: int) -> np.ndarray:
    """The 16 activation rows every implementation gets (M rows = the first M of them)."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=(max(MS), K)).astype(np.float16)


# ---------------------------------------------------------------------------------------------------
# Worker: one implementation, all workloads

def run_worker(plan: dict, impl: str, device) -> dict:
    """Runs under device.active(): every CuPy operation on the stream ORT runs on."""
    domain = IMPLS[impl][0]
    xp, gpu = device.xp, device.name == "cuda"
    result = {"impl": impl, "info": device_info(device), "workloads": {}, "errors": []}
    probes = {}  # outputs for the same A, saved before timing and checked by the parent
    for w in plan["workloads"]:
        entry = result["workloads"][w["name"]] = {"M": {}}
        try:
            started = time.time()
            session = make_session(device, w["models"][domain], graph_capture=gpu)
            entry["session_seconds"] = round(time.time() - started, 2)
            out_names = [o.name for o in session.get_outputs()]
            a_all = activations(w["K"], plan["seed"])
            cols = np.asarray(w["sample_columns"])
            for M in plan["ms"]:
                a = xp.asarray(a_all[:M])
                ys = xp.full((len(out_names), M, w["N"]), np.nan, dtype=np.float16)
                binding = session.io_binding()
                bind(binding, device, "A", a, a.shape)
                for i, name in enumerate(out_names):
                    bind(binding, device, name, ys[i], ys[i].shape, output=True)
                options = device.run_options(M)  # graph id M; the host does not wait for a run
                for _ in range(3):  # regular run, capture, replay
                    session.run_with_iobinding(binding, options)
                device.synchronize()
                y0 = ys[0]
                finite = bool(xp.isfinite(ys).all())
                picked = device.to_host(y0[:, xp.asarray(cols)])
                key = f"{w['name']}|{M}"
                probes[key + "|sample"] = picked.astype(np.float64)
                probes[key + "|bits"] = picked.view(np.int16)
                if w["kind"] == "chain":
                    probes[key + "|full"] = device.to_host(y0).astype(np.float64)
                start = time.perf_counter()
                session.run_with_iobinding(binding, options)
                device.synchronize()
                estimate = time.perf_counter() - start
                calls = int(min(100, max(3, round(plan["sample_seconds"] / max(estimate, 1e-6)))))

                def call():
                    session.run_with_iobinding(binding, options)

                # --prefill: the GPU busy while the host queues the calls (2 x the estimate's time at 2 GHz).
                prefill = int(2 * calls * estimate * 2e9) if plan.get("prefill") and gpu else 0
                samples = device.time_per_call(call, calls, plan["reps"],
                                               before=(lambda: busy_kernel(device, prefill)) if prefill else None)
                entry["M"][str(M)] = {"seconds": float(np.median(samples)), "samples": samples, "calls": calls,
                                      "host_seconds_per_call": host_seconds_per_call(device, call, calls),
                                      "finite": finite}
                del binding, ys, a
            del session
        except Exception as e:  # keep going: one failing workload must not lose the others
            entry["error"] = f"{type(e).__name__}: {e}"
            result["errors"].append({"workload": w["name"], "error": entry["error"],
                                     "traceback": traceback.format_exc()[-3000:]})
        gc.collect()
        free_device_memory(device)
    np.savez(plan["probe_prefix"] + f"{impl}.npz", **probes)
    return result


def run_copy_slots_worker(device, dry: bool) -> dict:
    """CopySlots over the 27B model's 48 linear-attention layers (conv [W,1,10240,3] and recurrent
    [W,1,48,128,128] states): promote slot 1 -> W-1 in place, and snapshot the unwindowed state
    ([1, ...], whole copies into separate buffers), each one launch under ORT's CUDA graph.
    Runs under device.active()."""
    xp, gpu = device.xp, device.name == "cuda"
    layers, W = (4, 4) if dry else (48, 4)
    conv, rec = ((1, 64, 3), (1, 4, 16, 16)) if dry else ((1, 10240, 3), (1, 48, 128, 128))
    results = {}
    for label, rec_dtype in (("fp16 recurrent", "float16"), ("fp32 recurrent", "float32")):
        for mode in ("promote slot 1->3 in place", "snapshot whole state"):
            lead = W if mode.startswith("promote") else 1
            specs = []
            for _ in range(layers):
                specs += [("float16", (lead,) + conv), (rec_dtype, (lead,) + rec)]
            model = copy_slots_model([(d, s, s) for d, s in specs])
            bufs = [xp.random.standard_normal(s).astype(d) for d, s in specs]
            outs = bufs if mode.startswith("promote") else [xp.empty_like(b) for b in bufs]
            slots = np.asarray((1, W - 1) if mode.startswith("promote") else (-1, -1), dtype=np.int64)
            graph = gpu
            for attempt in range(2):  # under ORT's CUDA graph; without it if capture is refused
                try:
                    session = make_session(device, model, graph_capture=graph)
                    binding = session.io_binding()
                    bind_host(binding, "slots", slots)
                    for i, (b, o) in enumerate(zip(bufs, outs)):
                        bind(binding, device, f"src_{i}", b, b.shape)
                        bind(binding, device, f"dst_{i}", b, b.shape)
                        bind(binding, device, f"out_{i}", o, o.shape, output=True)
                    for _ in range(3):
                        session.run_with_iobinding(binding, device.run_options(1 if graph else None))
                    device.synchronize()
                    break
                except Exception as e:
                    if not graph:
                        raise
                    graph_error, graph = f"{type(e).__name__}: {e}"[:500], False
            fast = device.run_options(1 if graph else None)  # the host does not wait for a run
            samples = device.time_per_call(lambda: session.run_with_iobinding(binding, fast), 50, 7)
            moved = sum(b[0].nbytes for b in bufs) if mode.startswith("promote") else sum(b.nbytes for b in bufs)
            t = float(np.median(samples))
            results[f"{mode}, {label}"] = {"tensors": len(bufs), "bytes_copied": moved, "us": t * 1e6,
                                           "GBps_read_plus_write": 2 * moved / t / 1e9, "cuda_graph": graph}
            if not graph and gpu:
                results[f"{mode}, {label}"]["cuda_graph_error"] = graph_error
            del session, binding, bufs, outs
            gc.collect()
    return results


# ---------------------------------------------------------------------------------------------------
# Parent: prepare, run the workers, check, summarise

def reference_columns(w: dict, a: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 Y[:, cols] of node 0 and its error scale (sum |a| |w|), from the weights on disk."""
    K, N = w["nodes"][0]
    k_blocks = K // BLOCK
    data = np.memmap(w["weights"], dtype=np.uint8, mode="r")
    b_off, b_len = w["offsets"][0]["B"]
    s_off, s_len = w["offsets"][0]["scales"]
    b = np.asarray(data[b_off:b_off + b_len]).reshape(N, k_blocks * BLOCK // 2)[cols]
    scales = np.frombuffer(np.asarray(data[s_off:s_off + s_len]).tobytes(), dtype=np.float16).reshape(N, k_blocks)[cols]
    q = np.empty((len(cols), K), dtype=np.float64)
    q[:, 0::2] = b & 15
    q[:, 1::2] = b >> 4
    wd = (q - 8.0) * np.repeat(scales.astype(np.float64), BLOCK, axis=1)
    a64 = a.astype(np.float64)
    return a64 @ wd.T, np.abs(a64) @ np.abs(wd).T


def fp16_ulp(x: np.ndarray) -> np.ndarray:
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** -14))) - 10)


def load_probes(plan: dict, impls) -> dict:
    probes = {}
    for impl in impls:
        path = Path(plan["probe_prefix"] + f"{impl}.npz")
        if path.exists():
            with np.load(path) as data:
                probes[impl] = {k: data[k] for k in data.files}
    return probes


def check_results(plan: dict, results: dict) -> dict:
    """Ours against a float64 reference (sampled columns of node 0) and against ORT's default kernel,
    every implementation's outputs finite, and our rows bit-identical across M."""
    checks = {}
    probes = load_probes(plan, results)
    for w in plan["workloads"]:
        name = w["name"]
        c = checks[name] = {}
        cols = np.asarray(w["sample_columns"])
        a_all = activations(w["K"], plan["seed"])
        bad = [f"{impl} M={M}" for impl, res in results.items()
               for M, m in res.get("workloads", {}).get(name, {}).get("M", {}).items() if not m["finite"]]
        if bad:
            c["non_finite"] = bad
        if w["kind"] == "parallel":
            for impl, p in probes.items():
                worst = None
                for M in plan["ms"]:
                    if f"{name}|{M}|sample" not in p:
                        continue
                    ref, mag = reference_columns(w, a_all[:M], cols)
                    tol = fp16_ulp(ref) + 2.0 ** -24 * (w["K"] / 16 + 64) * mag
                    err = float(np.max(np.abs(p[f"{name}|{M}|sample"] - ref) / tol))
                    worst = err if worst is None else max(worst, err)
                c[f"{impl}_max_err_over_tol"] = worst
            errs = [c[f"{i}_max_err_over_tol"] for i in probes if i.startswith("ours")]
            c["ours_correct"] = bool(errs) and all(e is not None and e <= 1.0 for e in errs)
        else:  # chain: each of ours vs ORT default end to end (8 fp16 roundings in a row: relative L2)
            for impl in [i for i in probes if i.startswith("ours")]:
                rel = {}
                for M in plan["ms"]:
                    key = f"{name}|{M}|full"
                    if key in probes[impl] and key in probes.get("ort", {}):
                        y, r = probes[impl][key], probes["ort"][key]
                        rel[str(M)] = float(np.linalg.norm(y - r) / max(np.linalg.norm(r), 1e-30))
                c[f"{impl}_vs_ort_rel_l2_max"] = max(rel.values()) if rel else None
            rels = [c[f"{i}_vs_ort_rel_l2_max"] for i in probes if i.startswith("ours")]
            c["ours_correct"] = bool(rels) and all(r is not None and r < 2e-2 for r in rels)
        for impl in [i for i in probes if i.startswith("ours")]:  # row i of every M = row i of the largest M
            got = [M for M in plan["ms"] if f"{name}|{M}|bits" in probes[impl]]
            if got:
                full = probes[impl][f"{name}|{max(got)}|bits"]
                c[f"{impl}_rows_bit_identical_across_M"] = all(
                    np.array_equal(probes[impl][f"{name}|{M}|bits"], full[:M]) for M in got)
    return checks


def summarise(plan: dict, results: dict, ceiling_GBps: float) -> dict:
    table = {}
    for w in plan["workloads"]:
        name = w["name"]
        rows = table[name] = {}
        ours1 = results.get("ours", {}).get("workloads", {}).get(name, {}).get("M", {}).get("1", {}).get("seconds")
        for impl, res in results.items():
            for M, m in res.get("workloads", {}).get(name, {}).get("M", {}).items():
                ort_t = results.get("ort", {}).get("workloads", {}).get(name, {}).get("M", {}).get(M, {}).get("seconds")
                t = m["seconds"]
                gbps = w["bytes_per_run"] / t / 1e9
                rows.setdefault(M, {})[impl] = {
                    "us": t * 1e6, "GBps": gbps, "pct_of_copy_ceiling": 100 * gbps / ceiling_GBps,
                    "ratio_to_ours_M1": t / ours1 if ours1 else None, "ratio_to_ort_default": t / ort_t if ort_t else None}
    return table


def targets(table: dict, impl: str = "ours") -> list[tuple[str, bool | None, str]]:
    """The GEMV's targets for one of our paths (`ours`: the default row-major layout; `ours_tiles`: the
    packed one), evaluated on the measured table. A target whose numbers are missing (the path failed or
    did not run) is reported as (name, None, "no data"): not met."""
    out = []

    def get(w, M, which, key="us"):
        return table.get(w, {}).get(str(M), {}).get(which, {}).get(key)

    def add(name, values, test, fmt):
        if values and all(v is not None for v in values):
            out.append((name, bool(test(*values)), fmt(*values)))
        else:
            out.append((name, None, "no data"))

    pct = [get("chain", M, impl, "pct_of_copy_ceiling") for M in (1, 2, 3, 4, 6, 8)]
    add("chain M=1..8 >= 85% of copy ceiling", pct, lambda *p: min(p) >= 85, lambda *p: f"min {min(p):.0f}%")
    add("chain M=16 >= 75% of copy ceiling", [get("chain", 16, impl, "pct_of_copy_ceiling")],
        lambda p: p >= 75, lambda p: f"{p:.0f}%")
    add("chain M=8 <= 1.15 x M=1", [get("chain", 8, impl), get("chain", 1, impl)], lambda t8, t1: t8 <= 1.15 * t1,
        lambda t8, t1: f"{t8 / t1:.2f}x")
    add("chain M=1 >= 1.6x faster than ORT default", [get("chain", 1, impl), get("chain", 1, "ort")],
        lambda o, d: d / o >= 1.6, lambda o, d: f"{d / o:.2f}x")
    best = [t for t in (get("lm_head", 1, "ort"), get("lm_head", 1, "ort_fpa_intb")) if t]
    add("lm_head M=1 at least as fast as ORT's best", [get("lm_head", 1, impl), min(best) if best else None],
        lambda o, b: o <= b, lambda o, b: f"{b / o:.2f}x")
    losses, compared = [], 0
    for w, rows in table.items():
        for M, row in rows.items():
            if int(M) < 2 or impl not in row:
                continue
            for ort_impl in ("ort", "ort_fpa_intb"):
                if ort_impl in row:
                    compared += 1
                    if row[impl]["us"] >= row[ort_impl]["us"]:
                        losses.append(f"{w} M={M} vs {ort_impl}")
    name = "faster than both ORT paths at every M >= 2"
    if compared:
        out.append((name, not losses, ", ".join(losses[:6]) or f"all {compared} comparisons"))
    else:
        out.append((name, None, "no data"))
    return out


def all_targets(table: dict) -> list[dict]:
    """The targets for the default path, and for the tiles path when it ran."""
    ran = {i for rows in table.values() for row in rows.values() for i in row}
    return [{"impl": impl, "target": t, "met": ok, "measured": v}
            for impl in ("ours", "ours_tiles") if impl == "ours" or impl in ran
            for t, ok, v in targets(table, impl)]


def format_table(plan: dict, table: dict, impls: list[str]) -> str:
    """us per run for every implementation; for ours also GB/s, % of the copy ceiling, and its time
    over our M=1 time and over ORT default's time at the same M (< 1: ours is faster)."""
    short = {"ort": "ort", "ort_fpa_intb": "fpA_intB", "ours": "ours", "ours_tiles": "tiles", "ours_nopdl": "nopdl",
             "ours_generic": "generic"}
    lines = [f"{'us per run':<12}{'M':>3}" + "".join(f"{short.get(i, i)[:9]:>10}" for i in impls)
             + "  ours: GB/s  %ceil t/tM1 t/tORT"]
    for w in plan["workloads"]:
        for M in plan["ms"]:
            row = table.get(w["name"], {}).get(str(M), {})
            cells = "".join(f"{row[i]['us']:>10.1f}" if i in row else f"{'-':>10}" for i in impls)
            ours, extra = row.get("ours"), ""
            if ours:
                fmt = lambda v: f"{v:>5.2f}" if v else "    -"  # noqa: E731
                extra = (f"  {ours['GBps']:>10.0f} {ours['pct_of_copy_ceiling']:>5.0f}% "
                         f"{fmt(ours['ratio_to_ours_M1'])} {fmt(ours['ratio_to_ort_default'])}")
            lines.append(f"{w['name'][:12]:<12}{M:>3}{cells}{extra}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU EP (no GPU)")
    parser.add_argument("--out", help="result folder (default: $OUT, else bench/results)")
    parser.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help=f"comma list of {sorted(IMPLS)}")
    parser.add_argument("--workloads", help="comma list of workload names (default: all)")
    parser.add_argument("--ms", default=",".join(map(str, MS)), help="comma list of M values")
    parser.add_argument("--scratch", default="/tmp/ort_mtp_gemv", help="where the weights are written")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--no-copy-slots", action="store_true", help="skip the CopySlots measurement")
    parser.add_argument("--prefill", action="store_true",
                        help="keep the GPU busy while the host queues each sample's calls")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.worker:
            device = open_device(args.cpu_dry_run)
            with device.active():
                if args.worker == "copy_slots":
                    res = {"copy_slots": run_copy_slots_worker(device, args.cpu_dry_run)}
                else:
                    res = run_worker(json.loads(Path(args.plan).read_text()), args.worker, device)
            Path(args.result).write_text(json.dumps(res))
            return 0
        return parent(args)
    except BenchError as e:
        print(f"gemv: {e}", file=sys.stderr)
        return 2


def parent(args) -> int:
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise BenchError(f"unknown --impls {unknown}; choose from {sorted(IMPLS)}")
    ms = [int(m) for m in args.ms.split(",")]
    if "ours" not in impls or "ort" not in impls:
        print("gemv: note: ratios need both 'ours' and 'ort' in --impls", file=sys.stderr)
    started = time.time()
    device = open_device(args.cpu_dry_run)
    report = {"info": device_info(device), "ms": ms, "impls": impls, "errors": []}
    nbytes = (64 << 20) if args.cpu_dry_run else (2 << 30)
    report["copy_ceiling_before"] = copy_ceiling(device, nbytes)
    free_device_memory(device)

    chosen = workloads(args.cpu_dry_run)
    if args.workloads:
        names = set(args.workloads.split(","))
        chosen = [w for w in chosen if w["name"] in names]
        if not chosen:
            raise BenchError(f"--workloads {args.workloads} matches none of {[w['name'] for w in workloads(args.cpu_dry_run)]}")
    scratch = Path(args.scratch)
    plan = {"seed": args.seed, "ms": ms, "reps": 3 if args.cpu_dry_run else 7,
            "probe_prefix": str(scratch / "probe_"),
            "sample_seconds": 0.002 if args.cpu_dry_run else 0.004, "prefill": args.prefill, "workloads": []}
    for i, w in enumerate(chosen):
        entry = write_workload(scratch / w["name"], w, args.seed + 100 * i, tiles="ours_tiles" in impls)
        rng = np.random.default_rng(args.seed + i)
        n_out = entry["nodes"][0][1] if w["kind"] == "parallel" else entry["N"]
        entry["sample_columns"] = sorted(rng.choice(n_out, size=min(SAMPLE_COLUMNS, n_out), replace=False).tolist())
        plan["workloads"].append(entry)
    plan_path = scratch / "plan.json"
    plan_path.write_text(json.dumps(plan))
    report["workloads"] = [{k: v for k, v in w.items() if k not in ("offsets", "sample_columns", "models")}
                           for w in plan["workloads"]]
    report["prepare_seconds"] = round(time.time() - started, 1)
    print(f"prepared {len(plan['workloads'])} workloads in {report['prepare_seconds']}s", flush=True)

    results = {}
    for impl in impls + ([] if args.no_copy_slots else ["copy_slots"]):
        env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
        env.update(IMPLS.get(impl, (None, {}))[1])
        result_path = scratch / f"result_{impl}.json"
        result_path.unlink(missing_ok=True)
        Path(plan["probe_prefix"] + f"{impl}.npz").unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl, "--plan", str(plan_path),
               "--result", str(result_path)] + (["--cpu-dry-run"] if args.cpu_dry_run else [])
        t0 = time.time()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not result_path.exists():
            report["errors"].append({"impl": impl, "returncode": proc.returncode, "stderr": proc.stderr[-3000:]})
            print(f"{impl}: FAILED (rc {proc.returncode}) {proc.stderr.strip().splitlines()[-1:] }", flush=True)
            continue
        res = json.loads(result_path.read_text())
        if impl == "copy_slots":
            report["copy_slots"] = res["copy_slots"]
        else:
            results[impl] = res
            report["errors"] += [{"impl": impl, **e} for e in res.get("errors", [])]
        print(f"{impl}: done in {time.time() - t0:.0f}s", flush=True)

    report["copy_ceiling_after"] = copy_ceiling(device, nbytes)
    ceiling = max(report["copy_ceiling_before"]["GBps"], report["copy_ceiling_after"]["GBps"])
    report["copy_ceiling_GBps"] = ceiling
    report["checks"] = check_results(plan, results)
    report["table"] = summarise(plan, results, ceiling)
    report["targets"] = all_targets(report["table"])
    if "copy_slots" in report:
        for v in report["copy_slots"].values():
            v["pct_of_copy_ceiling"] = 100 * v["GBps_read_plus_write"] / ceiling
    report["results"] = results
    report["seconds"] = round(time.time() - started, 1)
    path = out_dir(args.out) / "gemv.json"
    path.write_text(json.dumps(report, indent=1, default=str))

    print(f"wrote {path} ({report['seconds']}s)")
    print(f"copy ceiling (read+write): {ceiling:.0f} GB/s")
    for name, c in report["checks"].items():
        print(f"check {name}: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in c.items() if not isinstance(v, dict)))
    for e in report["errors"]:
        print(f"ERROR {e.get('impl')} {e.get('workload', '')}: {(e.get('error') or e.get('stderr', ''))[-300:]}")
    if "copy_slots" in report:
        for k, v in report["copy_slots"].items():
            print(f"CopySlots {k}: {v['tensors']} tensors, {v['bytes_copied'] / 1e6:.1f} MB, {v['us']:.1f} us, "
                  f"{v['GBps_read_plus_write']:.0f} GB/s ({v['pct_of_copy_ceiling']:.0f}% of ceiling)")
    print(format_table(plan, report["table"], [i for i in impls]))
    for t in report["targets"]:
        verdict = "NO DATA" if t["met"] is None else "MET" if t["met"] else "MISS"
        print(f"target {verdict:<7} {'tiles' if t['impl'] == 'ours_tiles' else 'ours':<5}: {t['target']}: {t['measured']}")
    # Every implementation of ours that ran: correct and its rows bit-identical across M.
    ok = not report["errors"] and all(
        c.get("ours_correct", True) and not c.get("non_finite")
        and all(v for k, v in c.items() if k.endswith("_rows_bit_identical_across_M"))
        for c in report["checks"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
