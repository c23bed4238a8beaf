"""Where buffers live and how ONNX Runtime sees them: numpy on the CPU EP, CuPy on the CUDA EP.

Both devices expose the same small surface, so the decoding loop is written once against `xp`
(numpy or cupy): buffers are allocated once, bound to IOBindings by pointer, and every per-token
update (positions, attention mask, argmax, copies between buffers) is an `xp` operation on the
device. Only token ids are copied to the host.

On CUDA, ONNX Runtime runs on the same stream as CuPy (provider option user_compute_stream), so a
CuPy kernel launched after a session run is ordered after it without any host synchronisation, and
runs are launched with disable_synchronize_execution_providers so the host does not wait for them.

The benchmarks and device checks (bench/gemv.py, tests/gpu/) use the same devices, with
make_session (a session on the device's EP and stream), time_per_call (CUDA-event timing on the
shared stream) and describe (versions and GPU for a report).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np
import onnxruntime as ort

import ops

from .errors import DriverError

# ONNX Runtime's session config key (onnxruntime_session_options_config_keys.h): the session's
# thread-pool threads stop spinning as soon as its last concurrent run returns.
FORCE_SPINNING_STOP = "session.force_spinning_stop"
GPU_GRAPH_ID = "gpu_graph_id"  # run config key: the CUDA graph a run captures or replays, -1 none


class CpuDevice:
    name = "cpu"
    ort_device = "cpu"
    device_id = 0
    graph_capture = False
    asynchronous = False  # a run returns when its work is done: host work cannot overlap it
    # No driver.shared_weights copy: ONNX Runtime maps the folder's data files on the CPU, so the head's
    # session already reads the main graph's embedding and lm_head from the same page-cache pages, and
    # a copy of ours would only add resident memory (bench/results/2026-12-05-shared-weights, cpu_rss.py).
    shares_weights = False

    def __init__(self, threads: int | None = None):
        self.xp = np
        self.threads = threads

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def pointer(self, array) -> int:
        return array.ctypes.data

    def providers(self, graph_capture: bool = False) -> list:
        return ["CPUExecutionProvider"]

    def session_options(self, options: ort.SessionOptions) -> None:
        if self.threads:
            options.intra_op_num_threads = self.threads
        # Each session has its own intra-op thread pool, whose threads by default keep spinning for a
        # while after a run returns. MTP alternates two sessions (the head's drafts, the main graph's
        # verify), so the idle session's spinning threads would take the cores the other one runs on:
        # on a 2-core machine that doubled the cost of every forward of the round. Stopping the spin
        # when a run returns keeps it inside runs, where it pays.
        options.add_session_config_entry(FORCE_SPINNING_STOP, "1")

    def run_options(self, graph_id: int | None = None) -> ort.RunOptions:
        options = ort.RunOptions()
        # ONNX Runtime's Python run_with_iobinding looks this key up on every run; where it is absent the
        # lookup raises and catches a C++ exception, a cost of the order of a small model's whole forward
        # (bench/cpu_fusions.py --variants default,plain-run-options measures it). -1 is its "no graph"
        # value: the CPU EP captures none anyway.
        options.add_run_config_entry(GPU_GRAPH_ID, "-1")
        return options

    def to_host(self, array) -> np.ndarray:
        return np.asarray(array)

    def host_buffer(self, shape, dtype) -> np.ndarray:
        """Host memory that start_to_host can copy into without waiting (plain memory on the CPU)."""
        return np.empty(shape, dtype=dtype)

    def start_to_host(self, array, out: np.ndarray):
        """Copies `array` into `out` (from host_buffer); returns what wait_to_host takes. The CPU's runs
        are synchronous, so the copy is done here."""
        out[...] = array

    def wait_to_host(self, started) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def active(self):
        return nullcontext()

    def time_per_call(self, fn, calls: int, reps: int, before=None) -> list[float]:
        """Seconds per call of fn(): `reps` samples of `calls` calls back to back, by the host clock.
        before(), if given, runs ahead of each sample, untimed."""
        samples = []
        for _ in range(reps):
            if before is not None:
                before()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - start) / calls)
        return samples


_STREAMS: dict[int, object] = {}  # one stream per GPU, shared by every Generator of the process
_DEVICE_TO_HOST = 2  # cudaMemcpyKind cudaMemcpyDeviceToHost (cuda_runtime_api.h)


class CudaDevice:
    """One GPU, one CuPy stream shared with ONNX Runtime."""

    name = "cuda"
    ort_device = "cuda"
    asynchronous = True  # a run returns once queued: the host can work while the GPU runs it
    shares_weights = True  # each session would upload its own copy of the head's shared tensors (driver.shared_weights)

    def __init__(self, device_id: int = 0, graph_capture: bool = True):
        cupy = _cuda_prerequisites(device_id)
        _preload_cuda_libraries()
        self.xp = cupy
        self.device_id = device_id
        self.graph_capture = graph_capture
        cupy.cuda.Device(device_id).use()
        if device_id not in _STREAMS:
            _STREAMS[device_id] = cupy.cuda.Stream(non_blocking=True)
        self.stream = _STREAMS[device_id]

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def pointer(self, array) -> int:
        return array.data.ptr

    def providers(self, graph_capture: bool = False) -> list:
        options = {
            "device_id": str(self.device_id),
            "user_compute_stream": str(self.stream.ptr),
            "enable_cuda_graph": "1" if graph_capture else "0",
        }
        return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]

    def session_options(self, options: ort.SessionOptions) -> None:
        pass

    def run_options(self, graph_id: int | None = None) -> ort.RunOptions:
        options = ort.RunOptions()
        # The host does not wait for a run: the next CuPy operation is stream-ordered after it.
        options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        options.add_run_config_entry(GPU_GRAPH_ID, str(-1 if graph_id is None else graph_id))
        return options

    def to_host(self, array) -> np.ndarray:
        return self.xp.asnumpy(array, stream=self.stream)  # waits for the stream up to this copy

    def host_buffer(self, shape, dtype) -> np.ndarray:
        """Page-locked host memory: a copy into it is asynchronous (start_to_host)."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        memory = self.xp.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
        return np.frombuffer(memory, dtype, count).reshape(shape)

    def start_to_host(self, array, out: np.ndarray):
        """Queues a copy of `array` (contiguous, on the device) into `out` (from host_buffer) on the
        stream, after the work queued so far, without waiting for it; returns the event that
        wait_to_host waits for. Work queued after it does not delay it."""
        cupy = self.xp
        cupy.cuda.runtime.memcpyAsync(out.ctypes.data, array.data.ptr, array.nbytes, _DEVICE_TO_HOST, self.stream.ptr)
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(self.stream)
        return event

    def wait_to_host(self, started) -> None:
        started.synchronize()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def active(self):
        """Makes the shared stream CuPy's current stream for the block: every CuPy operation in it is
        ordered with the ORT runs (which were given this stream at session creation)."""
        return self.stream

    def time_per_call(self, fn, calls: int, reps: int, before=None) -> list[float]:
        """Seconds per call of fn(): `reps` samples of `calls` calls issued back to back, each sample
        timed by two CUDA events on the shared stream, so it is the device's time for the work the
        calls queued there (the host does not wait between calls). before(), if given, is issued
        ahead of each sample's first event, untimed (a benchmark queues a busy kernel with it, so the
        GPU does not start the calls before the host has queued them)."""
        cupy = self.xp
        samples = []
        for _ in range(reps):
            begin, end = cupy.cuda.Event(), cupy.cuda.Event()
            if before is not None:
                before()
            begin.record(self.stream)
            for _ in range(calls):
                fn()
            end.record(self.stream)
            end.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(begin, end) * 1e-3 / calls)
        return samples


def _cuda_prerequisites(device_id: int):
    """CuPy, once everything --provider cuda needs is here. Otherwise a DriverError that names all
    that is missing at once: a machine without a GPU usually lacks CuPy too, and being told of one
    only to meet the other next is a wasted round."""
    missing = []
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        missing.append("onnxruntime-gpu (this onnxruntime has no CUDA execution provider)")
    try:
        import cupy
    except ImportError:
        cupy = None
        missing.append("CuPy (pip install cupy-cuda12x or cupy-cuda13x)")
    if _gpu_count(cupy) <= device_id:
        missing.append("a CUDA GPU (none is visible on this machine)")
    if missing:
        raise DriverError("--provider cuda needs " + " and ".join(missing))
    return cupy


def _gpu_count(cupy) -> int:
    """The GPUs CUDA sees: CuPy's count (CUDA_VISIBLE_DEVICES applied); without CuPy, those the NVIDIA
    driver lists (ops.visible_gpus, no CUDA context)."""
    if cupy is None:
        return len(ops.visible_gpus())
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        return 0


_PRELOADED = []


def _preload_cuda_libraries() -> None:
    """CUDA/cuDNN from the nvidia-* wheels, once, before the first CUDA session (ORT >= 1.21)."""
    if not _PRELOADED and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
        _PRELOADED.append(True)


def make_device(provider: str, graph_capture: bool = True, threads: int | None = None):
    if provider == "cpu":
        return CpuDevice(threads)
    if provider == "cuda":
        return CudaDevice(graph_capture=graph_capture)
    raise DriverError(f"unknown provider {provider!r} (cpu or cuda)")


def bind(binding: ort.IOBinding, device, name: str, array, shape, output: bool = False,
         elem_type: int | None = None) -> None:
    """Binds `array` (a device buffer, or a contiguous leading part of one, of `shape`) by pointer.
    elem_type: the ONNX element type (onnx.TensorProto.*) where it is not the array's own, e.g.
    bfloat16 held as uint16 bit patterns (numpy and CuPy have no bfloat16)."""
    element = array.dtype.type if elem_type is None else elem_type
    args = (device.ort_device, device.device_id, element, list(shape), device.pointer(array))
    if output:
        binding.bind_output(name, *args)
    else:
        binding.bind_input(name, *args)


def bind_host(binding: ort.IOBinding, name: str, array: np.ndarray) -> None:
    """Binds a host numpy array (an input a kernel reads on the host, e.g. CopySlots' slot indices)."""
    binding.bind_input(name, "cpu", 0, array.dtype.type, list(array.shape), array.ctypes.data)


def make_session(device, model, graph_capture: bool = False) -> ort.InferenceSession:
    """A session of `model` (a ModelProto, its serialized bytes or a path) on `device`'s EP and, on
    CUDA, its shared stream, with the ort_mtp library registered and ONNX Runtime's own log quiet
    (errors arrive as exceptions). For one-node graphs, benchmarks and device checks; the driver's
    model sessions are made by sessions.py."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    device.session_options(options)
    try:
        ops.register(options)
    except ops.LibraryNotFoundError as e:
        raise DriverError(str(e)) from None
    if hasattr(model, "SerializeToString"):
        source = model.SerializeToString()
    else:
        source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=device.providers(graph_capture))


def describe(device) -> dict:
    """What a report says about where it ran: ONNX Runtime's and numpy's versions, the device, and on
    CUDA CuPy's version and the GPU's name, SM count and memory."""
    info = {"onnxruntime": ort.__version__, "numpy": np.__version__, "device": device.name}
    if device.name == "cuda":
        cupy = device.xp
        props = cupy.cuda.runtime.getDeviceProperties(device.device_id)
        name = props["name"]
        info.update(cupy=cupy.__version__, gpu=name.decode() if isinstance(name, bytes) else name,
                    sm_count=props["multiProcessorCount"], memory_GiB=round(props["totalGlobalMem"] / 2**30, 1))
    return info
