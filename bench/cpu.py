"""CPU MatMulNBits: ours (ort_mtp) against ONNX Runtime's com.microsoft::MatMulNBits, and the copy
bandwidth measured in the same run; optionally greedy / MTP tok/s on the `small` preset.

Both ops are timed at accuracy_level 4 (int8 activations: what the builder and models/graph.py emit
for CPU int4; keys ours_*, ort_*) and at accuracy_level 0 (float32 activations; ours_l0_*, ort_l0_*);
ours at level 4 also without the int8 kernel's grouped copy of the weights (ORT_MTP_CPU_PACK=0;
ours_unpacked_*).

    python bench/cpu.py [--reps 21] [--threads 2] [--e2e FOLDER] [--out bench/results/cpu-gemv]

Each timed graph holds LAYERS independent MatMulNBits nodes of one shape, each with its own weights
(so the weights stream from memory, not from a core's L2), all reading the same A; one session.run
of it is timed and divided by LAYERS. Bytes per layer = B + scales + A + Y. The copy bandwidth is
numpy's copyto of a 256 MiB float32 array (read + write bytes / time). Every figure is the median of
--reps runs after warm-up. Targets (reported, not asserted): ours at M = 1..8 >= 80% of copy
bandwidth; ours M=8 <= 1.3 x M=1; our greedy tok/s >= ORT's path; our best MTP >= 1.5 x our greedy.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ops  # noqa: E402
from driver.device import FORCE_SPINNING_STOP  # noqa: E402
from ops import nbits  # noqa: E402

SHAPES = [(1024, 1024), (4096, 1024), (1024, 4096)]  # (N, K): out x in
MS = [1, 2, 4, 8]


def layers_model(ws, domain: str, accuracy_level: int = 0) -> onnx.ModelProto:
    K, N = ws[0].K, ws[0].N
    nodes, inits, outs = [], [], []
    for i, w in enumerate(ws):
        inits += [nbits.tensor(f"B{i}", w.b), nbits.tensor(f"S{i}", w.scales, w.dtype)]
        nodes.append(helper.make_node("MatMulNBits", ["A", f"B{i}", f"S{i}"], [f"Y{i}"], name=f"mm{i}", domain=domain,
                                      K=K, N=N, bits=w.bits, block_size=w.block_size,
                                      accuracy_level=accuracy_level))
        outs.append(helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, ["M", N]))
    graph = helper.make_graph(nodes, "layers", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              outs, initializer=inits)
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)])


@contextlib.contextmanager
def cpu_pack(on: bool):
    """Sessions created inside get the int8 kernel's grouped copy of the weights (the default) or not
    (ORT_MTP_CPU_PACK=0, which the kernel reads when a session creates it)."""
    saved = os.environ.pop("ORT_MTP_CPU_PACK", None)
    if not on:
        os.environ["ORT_MTP_CPU_PACK"] = "0"
    try:
        yield
    finally:
        os.environ.pop("ORT_MTP_CPU_PACK", None)
        if saved is not None:
            os.environ["ORT_MTP_CPU_PACK"] = saved


def session(model, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    # One process holds several of these sessions, each with its own thread pool, timed one after the
    # other: without this the idle ones' threads keep spinning after their runs and take the cores the
    # timed one runs on (as in the driver: driver/device.py). On 2 cores that made a 2 MB matmul take
    # 2.5x its time at M=1, and the M-scaling figures noise.
    so.add_session_config_entry(FORCE_SPINNING_STOP, "1")
    so.register_custom_ops_library(ops.library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def median_time(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def copy_bandwidth(reps: int) -> float:
    src = np.ones(64 * 1024 * 1024, np.float32)
    dst = np.empty_like(src)
    t = median_time(lambda: np.copyto(dst, src), reps)
    return 2 * src.nbytes / t / 1e9


def bench_matmul(args, copy_gbs: float) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for N, K in SHAPES:
        layers = max(4, min(32, (64 << 20) // (N * K // 2)))  # >= 64 MiB of int4 weights per graph
        ws = [nbits.random_weights(rng, K, N, bits=4, block_size=32, dtype="float32") for _ in range(layers)]
        weight_bytes = N * K // 2 + N * (K // 32) * 4
        sessions = {name: session(layers_model(ws, dom, level), args.threads)
                    for name, dom, level in (("ours", "ort_mtp", 4), ("ort", "com.microsoft", 4),
                                             ("ours_l0", "ort_mtp", 0), ("ort_l0", "com.microsoft", 0))}
        with cpu_pack(False):
            sessions["ours_unpacked"] = session(layers_model(ws, "ort_mtp", 4), args.threads)
        for M in MS:
            a = rng.standard_normal((M, K)).astype(np.float32)
            row = {"N": N, "K": K, "M": M, "layers": layers, "bytes_per_layer": weight_bytes + 4 * M * (K + N)}
            for name, s in sessions.items():
                t = median_time(lambda: s.run(None, {"A": a}), args.reps) / layers
                row[f"{name}_us"] = t * 1e6
                row[f"{name}_gbs"] = row["bytes_per_layer"] / t / 1e9
                row[f"{name}_pct_copy"] = 100 * row[f"{name}_gbs"] / copy_gbs
            rows.append(row)
            print(f"N={N:5d} K={K:5d} M={M}: level 4: ours {row['ours_us']:8.1f} us ({row['ours_pct_copy']:5.1f}% copy)  "
                  f"unpacked {row['ours_unpacked_us']:8.1f} us  "
                  f"ORT {row['ort_us']:8.1f} us ({row['ort_pct_copy']:5.1f}%); level 0: ours {row['ours_l0_us']:8.1f} us  "
                  f"ORT {row['ort_l0_us']:8.1f} us", flush=True)
    return rows


E2E_PATHS = (("ort", False, True), ("ours", True, True), ("ours_unpacked", True, False))  # (name, rewrite, grouped copy)
E2E_MODES = (("greedy", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3), ("mtp", 4))


def bench_e2e(folder: str, args) -> dict:
    """tok/s of ONNX Runtime's ops (rewrite=False), ours, and ours without the int8 kernel's grouped copy
    of the weights (ORT_MTP_CPU_PACK=0 while the session is created), greedy and MTP k = 1..4: one
    Generator per path and mode (below), and the repetitions interleaved over paths and modes, so that
    a noisy machine's slow spells fall on all of them alike. Medians."""
    from driver import Generator

    prompt = list(range(5, 5 + 32))
    generators = {}
    paths = [(name, folder, rewrite, pack) for name, rewrite, pack in E2E_PATHS]
    if args.e2e_windowed:  # the same model exported with a state window: ours only (ORT's CPU kernels refuse it)
        paths.append(("ours_windowed", args.e2e_windowed, True, True))
    # Each mode and k on its own Generator, as `python -m driver generate --mode M --draft-tokens K` runs
    # it: an MTP Generator's main session carries a state window of k+1 slots added in memory
    # (ops.state_window) to a folder exported without one, which a greedy step would pay for.
    for path, where, rewrite, pack in paths:
        with cpu_pack(pack):
            for mode, k in E2E_MODES:
                generators[path, k] = Generator(where, provider="cpu", mode=mode, draft_tokens=max(k, 1),
                                                rewrite=rewrite, threads=args.threads)
    runs: dict[str, list[float]] = {}
    tokens: dict[str, list[int]] = {}
    acceptance: dict[str, float] = {}
    for rep in range(args.e2e_reps + 1):  # the first pass warms up
        for mode, k in E2E_MODES:
            for path, *_ in paths:
                r = generators[path, k].generate(prompt, args.new_tokens, stop_at_eos=False)
                key = f"{path}_{mode}" + (f"_k{k}" if k else "")
                if rep:
                    runs.setdefault(key, []).append(
                        r.stats.new_tokens / r.stats.decode_seconds if r.stats.decode_seconds else 0.0)
                tokens[key] = r.tokens
                if k:
                    acceptance[key] = r.stats.as_dict().get("acceptance")
    out = {}
    for key, tps in runs.items():
        out[key] = {"tok_s": float(np.median(tps)), "tok_s_runs": tps, "tokens": tokens[key]}
        if key in acceptance:
            out[key]["acceptance"] = acceptance[key]
            out[key]["equals_greedy"] = tokens[key] == tokens[key.split("_mtp_")[0] + "_greedy"]
        print(f"{key}: {out[key]['tok_s']:.1f} tok/s" + (f" (acceptance {acceptance[key]:.2f})" if key in acceptance else ""),
              flush=True)
    return out


def run_record(**fields) -> dict:
    """The opening of a CPU bench script's result: the command as run (python bench/<script> <args>),
    today's date and the revision (git_revision), then `fields`."""
    return {"command": " ".join(["python", "bench/" + Path(sys.argv[0]).name] + sys.argv[1:]),
            "date": datetime.date.today().isoformat(), "revision": git_revision(), **fields}


def write_result(result: dict, out) -> None:
    """Writes `result` as JSON to `out` (a path; None: nowhere) and says so."""
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")


def git_revision() -> str:
    """This tree's revision ("-dirty" with uncommitted changes to tracked files); on the device machine
    ORT_MTP_REVISION, which bench/device_library.sh sets from the carried .devlib/revision, since the git
    history there is not the development tree's (the JSONs said the session's first commit)."""
    if os.environ.get("ORT_MTP_REVISION"):
        return os.environ["ORT_MTP_REVISION"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--e2e", default=None, help="model folder (python -m models build --preset small --ep cpu)")
    ap.add_argument("--e2e-windowed", default=None,
                    help="the same model built with --state-window (e.g. 4): also time ours on it")
    ap.add_argument("--e2e-reps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench/results/cpu-gemv"))
    args = ap.parse_args()

    copy_before = copy_bandwidth(args.reps)
    print(f"copy bandwidth: {copy_before:.1f} GB/s", flush=True)
    rows = bench_matmul(args, copy_before)
    copy_after = copy_bandwidth(args.reps)
    print(f"copy bandwidth after: {copy_after:.1f} GB/s", flush=True)
    result = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "revision": git_revision(),
        "library": ops.library_path(),
        "cpu_kernel_env": os.environ.get("ORT_MTP_CPU_KERNEL", "auto"),
        "onnxruntime": ort.__version__,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "threads": args.threads,
        "copy_gbs": copy_before,
        "copy_gbs_after": copy_after,
        "matmul": rows,
    }
    m1 = {(r["N"], r["K"]): r["ours_us"] for r in rows if r["M"] == 1}
    result["targets"] = {
        "ours_min_pct_copy_M1_8": min(r["ours_pct_copy"] for r in rows),
        "ours_max_M8_over_M1": max(r["ours_us"] / m1[(r["N"], r["K"])] for r in rows if r["M"] == 8),
    }
    if args.e2e:
        result["e2e"] = bench_e2e(args.e2e, args)
        result["e2e_folder"] = args.e2e
        result["e2e_windowed_folder"] = args.e2e_windowed
        e2e = result["e2e"]
        result["targets"]["greedy_ours_over_ort"] = e2e["ours_greedy"]["tok_s"] / e2e["ort_greedy"]["tok_s"]
        # the default path's best MTP (on the windowed export where timed) against the default greedy
        best = max((key for key in e2e if key.startswith(("ours_mtp", "ours_windowed_mtp"))), key=lambda k: e2e[k]["tok_s"])
        result["targets"]["best_mtp_ours"] = best
        result["targets"]["best_mtp_ours_over_ours_greedy"] = e2e[best]["tok_s"] / e2e["ours_greedy"]["tok_s"]
        result["targets"]["mtp_equals_greedy_everywhere"] = all(v.get("equals_greedy", True) for v in e2e.values())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = result["date"].replace(":", "").replace("+0000", "Z")
    path = out / f"cpu-{stamp}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["targets"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
