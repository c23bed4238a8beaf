"""The GPU checks of the CUDA kernels of both ops, as pytest tests: one test per group, each group in
its own process. On a machine with a CUDA GPU, from the repository root:

    python -m pytest tests/gpu                          # every group (a few minutes on an H200)
    python -m pytest tests/gpu -k "smoke or copy_slots" # one small case per kernel path, and CopySlots
    python -m pytest tests/gpu -k "[smoke-mma]"         # one group by its exact name
    python -m pytest tests/gpu --gpu-jobs 4             # four groups at a time (separate processes)
    python -m pytest tests/gpu -k smoke --sanitizer memcheck   # each group under compute-sanitizer
    python -m pytest tests/gpu --gpu-seed 1234          # the random data of an earlier run again
    python -m pytest tests/gpu --cpu-dry-run -k copy_slots     # the harness itself, on the CPU EP

Options: --sanitizer {memcheck,racecheck,synccheck,initcheck} (--sanitizer-path EXE), --gpu-jobs N,
--gpu-seed N (default: from the clock, shown in the header and in every failure), --random-cases N
(the matmul group's, default 24), --group-timeout S (default 600), --gpu-logs DIR (each group's
<group>.log and <group>.json; default a new temporary folder, named in the header). A failing group's
message names its failing cases, what compute-sanitizer found, and the command that reruns the group
alone (python tests/gpu/worker.py --group NAME --seed N).

Pytest takes these options only where tests/gpu (or a file in it) is named on the command line. The
whole suite (`python -m pytest`) runs these tests too where there is a GPU; `-m "not gpu"` leaves
them out.

Each group runs in its own process (worker.py, started by group_process.py): a kernel fault leaves a
CUDA context in which every later call fails, and the library reads its kernel-selection switches
(ORT_MTP_GEMV_VARIANT, ORT_MTP_GEMV_PDL) once per process, so a group that sets one needs its own.
The parent process makes no GPU call beyond the cheap check below.

Without a usable CUDA GPU (no CUDAExecutionProvider in onnxruntime, no CUDA driver or no device,
no CuPy) every test marked `gpu` is skipped, the reason shown by `pytest -rs`; the check is
cuInit / cuDeviceGetCount through ctypes, which creates no context.

The library under test is ops.library_path()'s (ORT_MTP_LIBRARY overrides it); nothing is built.
"""

from __future__ import annotations

import ctypes
import importlib.util
import time
from pathlib import Path

import pytest

import group_process
from group_process import SANITIZER_TOOLS, GroupPool, Options

_POOL = pytest.StashKey[GroupPool]()
_REASON = pytest.StashKey[str | None]()


def pytest_addoption(parser):
    group = parser.getgroup("gpu", "GPU checks (tests/gpu)")
    group.addoption("--sanitizer", choices=SANITIZER_TOOLS,
                    help="run each group's process under compute-sanitizer with this tool; a group fails when "
                         "the tool reports an error")
    group.addoption("--sanitizer-path", help="compute-sanitizer executable (default: PATH, then $CUDA_HOME/bin)")
    group.addoption("--gpu-jobs", type=int, default=1, help="groups run at once (default 1)")
    group.addoption("--gpu-seed", type=int, help="seed of the groups' random data (default: from the clock)")
    group.addoption("--random-cases", type=int, default=24, help="random cases of the matmul group (default 24)")
    group.addoption("--group-timeout", type=int, default=600, help="seconds one group may take (default 600)")
    group.addoption("--gpu-logs", help="folder for each group's log and result (default: a new temporary folder)")
    group.addoption("--cpu-dry-run", action="store_true",
                    help="run the groups on the CPU EP instead (tests this harness without a GPU; graph capture "
                         "off; matmul and decode take many minutes there)")


def cuda_device_count() -> tuple[int, str | None]:
    """(visible CUDA devices, why none) from the driver API, without creating a context."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no CUDA driver (libcuda.so.1 cannot be loaded)"
    status = cuda.cuInit(0)
    if status != 0:
        return 0, f"cuInit failed with CUDA error {status} (no usable GPU, or CUDA_VISIBLE_DEVICES hides it)"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return 0, f"cuDeviceGetCount failed with CUDA error {status}"
    return count.value, None if count.value else "the CUDA driver sees no device"


def why_no_gpu() -> str | None:
    """None when the checks can run here, else why not (the skip reason)."""
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return (f"needs a CUDA GPU: onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider "
                f"(providers {providers}; install onnxruntime-gpu)")
    count, why = cuda_device_count()
    if not count:
        return f"needs a CUDA GPU: {why}"
    if importlib.util.find_spec("cupy") is None:
        return "needs CuPy for the device buffers (pip install cupy-cuda13x), as the driver's CUDA path does"
    return None


def pytest_configure(config):
    config.stash[_REASON] = None
    seed = config.getoption("gpu_seed", default=None)
    logs = config.getoption("gpu_logs", default=None)
    config.gpu_options = Options(
        logs=Path(logs) if logs else None,
        seed=int(time.time()) % 100000 if seed is None else seed,
        random_cases=config.getoption("random_cases", default=24),
        timeout=config.getoption("group_timeout", default=600),
        sanitizer=config.getoption("sanitizer", default=None),
        sanitizer_path=config.getoption("sanitizer_path", default=None),
        provider="cpu" if config.getoption("cpu_dry_run", default=False) else "cuda")
    config.stash[_POOL] = GroupPool(config.gpu_options, jobs=max(1, config.getoption("gpu_jobs", default=1)))


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    options = config.gpu_options
    if options.provider == "cpu" and options.sanitizer:
        raise pytest.UsageError("--sanitizer needs the GPU: drop --cpu-dry-run")
    reason = why_no_gpu() if options.provider == "cuda" else None
    config.stash[_REASON] = reason
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
        return
    if options.sanitizer and group_process.find_sanitizer(options.sanitizer_path) is None:
        raise pytest.UsageError(f"--sanitizer {options.sanitizer}: compute-sanitizer not found (PATH, $CUDA_HOME/bin; "
                                "or pass --sanitizer-path)")
    group_process.interrupt_on_sigterm()


def pytest_collection_finish(session):
    """With --gpu-jobs N, queues the selected groups, in the tests' order, as soon as they are known."""
    if session.config.stash.get(_REASON, None) is None:
        names = [item.callspec.params["group"] for item in session.items
                 if item.get_closest_marker("gpu") and hasattr(item, "callspec") and "group" in item.callspec.params]
        session.config.stash[_POOL].start(names)


def pytest_unconfigure(config):
    pool = config.stash.get(_POOL, None)
    if pool is not None:
        pool.close()


def pytest_report_header(config, start_path):
    """Called where this conftest is an initial one (`pytest tests/gpu ...`)."""
    options = config.gpu_options
    tool = f", under compute-sanitizer --tool {options.sanitizer}" if options.sanitizer else ""
    tool += ", on the CPU EP (--cpu-dry-run)" if options.provider == "cpu" else ""
    logs = options.logs or "a new temporary folder (--gpu-logs)"
    return f"gpu checks: seed {options.seed} (--gpu-seed), logs in {logs}{tool}"


@pytest.fixture(scope="session")
def gpu_groups(request) -> GroupPool:
    """Runs a group (by name) in its own process and returns its GroupResult."""
    return request.config.stash[_POOL]


@pytest.fixture
def check_group(gpu_groups, record_property):
    """check_group(name) -> GroupResult: runs the group, records its cases, failures and seconds in
    the JUnit XML, and fails the test with a message that names the failing cases."""

    def check(name: str):
        result = gpu_groups.result(name)
        record_property("cases", len(result.records))
        record_property("failed_cases", len(result.failed_records))
        record_property("group_seconds", round(result.seconds, 1))
        record_property("seed", result.options.seed)
        if result.report.get("info"):
            record_property("device", result.report["info"])
        worst = [r.get(k, {}).get("max_err_over_tol") for r in result.records
                 for k in ("cuda", "accuracy", "accuracy_at_max_M") if isinstance(r.get(k), dict)]
        if any(w is not None for w in worst):
            record_property("worst_error_over_tolerance", max(w for w in worst if w is not None))
        if not result.ok:
            pytest.fail(result.failure_message(), pytrace=False)
        return result

    return check
