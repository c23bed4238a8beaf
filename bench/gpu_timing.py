"""Timing pieces only the benchmarks need, on top of the driver's devices (driver/device.py, whose
time_per_call times calls with CUDA events on the stream ONNX Runtime shares with CuPy):

  copy_ceiling           the device-to-device copy bandwidth, the ceiling a GEMV is scored against;
  busy_kernel            a kernel that keeps the GPU busy while the host queues a sample's calls;
  host_seconds_per_call  the host's own pace issuing calls, not waiting for the device;
  time_queued            device time per call, each sample queued behind busy_kernel;
  time_bound_run         one IOBinding run of a session timed so, after its warm-up runs;
  graph_or_eager         a measurement under ORT's CUDA graph, or eagerly where capture is refused;
  out_dir                where a benchmark writes its JSON;
  op_bench_args          the op benchmarks' shared options (--out, --reps, --calls, --seed, --cpu-dry-run);
  run_impls              each implementation's measurement, one failure kept as an error, not fatal.

On the CPU EP (a benchmark's dry run) they use the host clock and numpy, and busy_kernel does nothing.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from functools import lru_cache
from pathlib import Path

import numpy as np

SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""


@lru_cache(maxsize=1)
def _spin_kernel():
    import cupy

    return cupy.RawKernel(SPIN_SOURCE, "spin")  # compiled by NVRTC on first use


def busy_kernel(device, cycles: int) -> None:
    """Queues one thread spinning for `cycles` GPU clocks on the device's shared stream (torch's
    cuda._sleep), so that calls queued after it start only once the host has queued them all."""
    if device.name != "cuda" or cycles <= 0:
        return
    with device.active():
        _spin_kernel()((1,), (1,), (np.int64(cycles),))


def host_seconds_per_call(device, fn, calls: int) -> float:
    """The host's time per call of fn() issued back to back, not waiting for the device."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    pace = (time.perf_counter() - start) / calls
    device.synchronize()
    return pace


def copy_bytes(device, dst, src) -> None:
    """dst = src, one device-to-device copy (cudaMemcpyAsync on the shared stream), or numpy's on the CPU."""
    if device.name == "cuda":
        dst.data.copy_from_device_async(src.data, src.nbytes, stream=device.stream)
    else:
        np.copyto(dst, src)


def copy_ceiling(device, nbytes: int, reps: int = 10) -> dict:
    """Device-to-device copy bandwidth counting bytes read + written (the copy ceiling that gemv.py's percentages are of)."""
    xp = device.xp
    with device.active():
        src = xp.random.randint(0, 255, size=nbytes, dtype=np.uint8)
        dst = xp.empty_like(src)
        copy_bytes(device, dst, src)  # warm-up
        samples = device.time_per_call(lambda: copy_bytes(device, dst, src), 1, reps)
        ok = bool(xp.array_equal(src, dst))
    median = float(np.median(samples))
    del src, dst
    return {"bytes": nbytes, "seconds_median": median, "GBps": 2 * nbytes / median / 1e9, "copy_correct": ok}


def time_queued(device, call, calls: int, reps: int) -> dict:
    """Device time per call of call(), the median over `reps` samples of `calls` back-to-back calls
    timed with CUDA events, each sample queued behind busy_kernel (~2x the host's queueing time at
    2 GHz) so that the GPU starts once the host has queued it all. Returns {"us", "samples_us",
    "host_us_per_call"} and "busy_kernel_error" where the busy kernel could not run (timed without it)."""
    pace = host_seconds_per_call(device, call, calls)
    result, before = {}, None
    if device.name == "cuda":
        cycles = int(2 * calls * pace * 2e9)
        try:
            busy_kernel(device, 1000)  # compiled by NVRTC on first use
            before = lambda: busy_kernel(device, cycles)  # noqa: E731
        except Exception as e:  # noqa: BLE001  (timed without it, saying so)
            result["busy_kernel_error"] = f"{type(e).__name__}: {e}"[:300]
    samples = device.time_per_call(call, calls, reps, before=before)
    return {"us": float(np.median(samples)) * 1e6, "samples_us": [s * 1e6 for s in samples],
            "host_us_per_call": pace * 1e6, **result}


def time_bound_run(device, session, binding, options, calls: int, reps: int, first=None) -> tuple[dict, object]:
    """(time_queued of session.run_with_iobinding(binding, options), first()'s value): a first run,
    whose outputs first() reads (None without it), then two more (under a CUDA graph: its capture and
    first replay), then the timed calls."""
    session.run_with_iobinding(binding, options)
    device.synchronize()
    out = first() if first is not None else None
    for _ in range(2):
        session.run_with_iobinding(binding, options)
    device.synchronize()
    return time_queued(device, lambda: session.run_with_iobinding(binding, options), calls, reps), out


def graph_or_eager(device, measure) -> dict:
    """measure(graph: bool) -> dict, under ORT's CUDA graph on CUDA, and once more eagerly where that
    raises (ORT refuses to capture some node); the dict gets "cuda_graph", how it was measured, and
    after a refusal "cuda_graph_error", why."""
    graph = device.name == "cuda"
    try:
        result = measure(graph)
    except Exception as e:  # noqa: BLE001  (measured eagerly instead, saying why)
        if not graph:
            raise
        result = measure(False)
        result["cuda_graph_error"] = f"{type(e).__name__}: {e}"[:500]
        graph = False
    result["cuda_graph"] = graph
    return result


def out_dir(explicit: str | None) -> Path:
    """Where results go: --out, else $OUT (the device machine's return folder), else bench/results."""
    folder = Path(explicit or os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def op_bench_args(description: str, argv, reps: int, calls: int) -> argparse.Namespace:
    """The options every op benchmark (float_matmul.py, group_query_attention.py, gated_delta_net.py)
    takes, with its own defaults for --reps and --calls."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out")
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--calls", type=int, default=calls)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-dry-run", action="store_true")
    return parser.parse_args(argv)


def run_impls(device, impls, measure) -> tuple[dict, list]:
    """{impl: measure(impl)} over `impls` inside the device's context, and the errors of those that raised
    (one failing implementation must not lose the others' results)."""
    results, errors = {}, []
    with device.active():
        for impl in impls:
            try:
                results[impl] = measure(impl)
            except Exception as e:  # noqa: BLE001  (kept in the report, with its traceback)
                errors.append({"impl": impl, "error": f"{type(e).__name__}: {e}"[:1000],
                               "traceback": traceback.format_exc()[-3000:]})
    return results, errors
