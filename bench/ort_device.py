"""Device plumbing shared by the bench scripts (check_cuda_ops.py, gemv.py).

ONNX Runtime sessions on the CUDA EP with the ort_mtp library registered, torch tensors as IOBinding
buffers, and one torch stream shared with ONNX Runtime (provider option user_compute_stream), so
torch events recorded on it bracket exactly the work ONNX Runtime launched. With --cpu-dry-run the
same code runs on the CPU EP with CPU tensors and a host clock: that is how the scripts' logic is
tested on a machine without a GPU.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `ops` from the checkout when it is not pip-installed

import onnxruntime as ort  # noqa: E402
from onnx import TensorProto  # noqa: E402

import ops  # noqa: E402


class BenchError(RuntimeError):
    """A setup problem reported as one line (no traceback) by the scripts' main()."""


def out_dir(explicit: str | None) -> Path:
    """Where results go: --out, else $OUT (the device machine's return folder), else bench/results."""
    folder = Path(explicit or os.environ.get("OUT") or ROOT / "bench" / "results")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def library_path() -> str:
    try:
        return ops.library_path()
    except ops.LibraryNotFoundError as e:
        raise BenchError(str(e)) from None


ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
             "int64": TensorProto.INT64, "int32": TensorProto.INT32, "uint8": TensorProto.UINT8,
             "bool": TensorProto.BOOL}


class Device:
    """The CUDA device (one torch stream shared with ONNX Runtime) or, for a dry run, the CPU."""

    def __init__(self, cpu: bool):
        self.cpu = cpu
        if not cpu:
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BenchError(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider: put "
                                 "onnxruntime-gpu first on PYTHONPATH, or pass --cpu-dry-run")
            if hasattr(ort, "preload_dlls"):
                ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels, before the first session
        try:
            import torch
        except ImportError:
            raise BenchError("these scripts use torch for device buffers and events: pip install torch") from None
        self.torch = torch
        if cpu:
            self.name = "cpu"
            return
        if not torch.cuda.is_available():
            raise BenchError("no CUDA device visible to torch: run on the GPU machine or pass --cpu-dry-run")
        self.name = "cuda"
        self.stream = torch.cuda.Stream()
        torch.cuda.set_stream(self.stream)

    # ---- sessions ----
    def providers(self, graph: bool = False) -> list:
        if self.cpu:
            return ["CPUExecutionProvider"]
        options = {"device_id": "0", "user_compute_stream": str(self.stream.cuda_stream),
                   "enable_cuda_graph": "1" if graph else "0"}
        return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]

    def session(self, model, graph: bool = False, cpu: bool | None = None) -> ort.InferenceSession:
        """`model`: a ModelProto, serialized bytes or a path. cpu=True forces the CPU EP."""
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.register_custom_ops_library(library_path())
        if hasattr(model, "SerializeToString"):
            source = model.SerializeToString()
        else:
            source = str(model) if isinstance(model, Path) else model
        providers = ["CPUExecutionProvider"] if (cpu or self.cpu) else self.providers(graph)
        return ort.InferenceSession(source, options, providers=providers)

    def run_options(self, graph_id: int | None = None, sync: bool = True) -> ort.RunOptions:
        options = ort.RunOptions()
        if not self.cpu:
            options.add_run_config_entry("gpu_graph_id", str(-1 if graph_id is None else graph_id))
            if not sync:  # the host does not wait; torch events / synchronize() order the reads
                options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        return options

    # ---- buffers ----
    def tensor(self, values: np.ndarray, dtype: str):
        """A device tensor of `dtype` holding `values` (for bfloat16: float32 values that bfloat16
        represents exactly, so the conversion is lossless)."""
        torch = self.torch
        t = torch.from_numpy(np.ascontiguousarray(values))
        target = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(dtype)
        if target is not None:
            t = t.to(target)
        return t.to(self.name).contiguous()

    def full(self, shape, dtype: str, value: float):
        torch = self.torch
        return torch.full(tuple(shape), value, dtype=getattr(torch, dtype), device=self.name)

    def bind(self, binding: ort.IOBinding, name: str, t, output: bool = False) -> None:
        dtype = str(t.dtype).replace("torch.", "")
        elem = ONNX_TYPE["bfloat16"] if dtype == "bfloat16" else np.dtype(dtype).type
        args = (self.name, 0, elem, list(t.shape), t.data_ptr())
        (binding.bind_output if output else binding.bind_input)(name, *args)

    def numpy(self, t) -> np.ndarray:
        """float64 (floating tensors) or native copy on the host, after the stream's work is done."""
        self.synchronize()
        if t.is_floating_point():
            return t.detach().to("cpu", self.torch.float64).numpy()
        return t.detach().cpu().numpy()

    def bits(self, t) -> np.ndarray:
        """The raw bit patterns of a float tensor (for bit-identity checks)."""
        self.synchronize()
        view = {2: self.torch.int16, 4: self.torch.int32, 8: self.torch.int64}[t.element_size()]
        return t.detach().contiguous().view(view).cpu().numpy()

    def synchronize(self) -> None:
        if not self.cpu:
            self.stream.synchronize()

    # ---- timing ----
    def time_per_call(self, fn, calls: int, reps: int, prefill_cycles: int = 0) -> list[float]:
        """Seconds per call of fn(), `reps` samples of `calls` back-to-back calls each. prefill_cycles: a
        sleep kernel of that many GPU clocks first, so that the host has queued the calls before the GPU
        reaches them (the GPU's time alone, not the host's pace; lab run 42)."""
        samples = []
        for _ in range(reps):
            if self.cpu:
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples.append((time.perf_counter() - start) / calls)
            else:
                torch = self.torch
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if prefill_cycles:
                    with torch.cuda.stream(self.stream):
                        torch.cuda._sleep(prefill_cycles)
                begin.record(self.stream)
                for _ in range(calls):
                    fn()
                end.record(self.stream)
                end.synchronize()
                samples.append(begin.elapsed_time(end) * 1e-3 / calls)
        return samples

    def host_seconds_per_call(self, fn, calls: int) -> float:
        """The host's time per call of fn() issued back to back, not waiting for the device."""
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        pace = (time.perf_counter() - start) / calls
        self.synchronize()
        return pace

    def copy_ceiling(self, nbytes: int, reps: int = 10) -> dict:
        """Device-to-device copy bandwidth counting bytes read + written (METHOD.md's ceiling)."""
        torch = self.torch
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=self.name)
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up
        samples = self.time_per_call(lambda: dst.copy_(src), 1, reps)
        ok = bool(torch.equal(src, dst))
        median = float(np.median(samples))
        del src, dst
        return {"bytes": nbytes, "seconds_median": median, "GBps": 2 * nbytes / median / 1e9, "copy_correct": ok}


def device_info(device: Device) -> dict:
    info = {"onnxruntime": ort.__version__, "numpy": np.__version__, "torch": device.torch.__version__,
            "device": device.name, "library": library_path()}
    if not device.cpu:
        props = device.torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sm_count=props.multi_processor_count,
                    memory_GiB=round(props.total_memory / 2**30, 1))
    for key in ("ORT_MTP_GEMV_VARIANT", "ORT_MTP_GEMV_PDL", "ORT_FPA_INTB_GEMM"):
        if os.environ.get(key):
            info[key] = os.environ[key]
    return info
