"""ort_mtp::GroupQueryAttention on the device: the checks of the group-query-attention group (the CUDA
kernel, registered by default: csrc/attention/group_query_attention_cuda.cu).

Every case has fresh random inputs from the run's seed (ops.group_query_attention.random_case: `past`
cached positions in a longer buffer whose other positions are random too, S new tokens), runs the
one-node model with IOBinding on device buffers, outputs poisoned with NaN first (an element the
kernel leaves unwritten fails), total_sequence_length bound on the host (a CPU input, as ORT's own).

  1. CUDA against our CPU op (double arithmetic): the 27B-class layer (Nq=24, Nkv=4, H=256, fp16) at
     S = 1, 5, 16 over 100 cached positions, the presets' shapes, a local window, a softcap, bf16 and
     fp32, batch 2, and ctx.random_cases random ones. The cache (copies) must be bit-equal; the output
     within TOLERANCE.
  2. The same case's width-S call against S width-1 calls on the device, each step's present the next
     step's past: every output row bit-identical, and the cache. For S <= 16 (decode, verify and
     re-advance widths) only: wider 16-bit calls take the prefill kernel, whose rows depend on their
     place in its 64-row query tile (allowed: greedy and MTP run the same prefill).
  3. Shared buffer: present bound to past's own buffers (the driver's binding): the output bit-equal to
     the run into separate outputs, the new rows written, every other position untouched.
  4. A seqlens_k past the end of the cache: the rows of that batch row are NaN, nothing else changes
     (run under compute-sanitizer memcheck, nothing is written out of bounds); the CPU op (a dry run)
     refuses it with an error naming the node.

Not covered here: capture under ORT's CUDA graph (total_sequence_length is a CPU input, which a
one-node graph input cannot be under capture); the driver's end-to-end run on the 27B-class folder
checks the op inside its captured graphs.

TOLERANCE. The CPU op computes each score in double and rounds it to float32; the CUDA kernel computes
it with a float32 fma chain over H features (~H u_32 of sum |q_i k_i|), its softmax and weighted sum
in float32 over the row's n positions (~n u_32), and both round the output to T (one unit apart at
most, 2 u_T). Allowed, relative to the output's largest element: 4 u_T + 4 (H + n) u_32 max|q| max|k|
scale (the score error moves every weight by about as much). The prefill kernel (S > 16, 16-bit) also
rounds each softmax weight to T before the weighted sum (flash attention's P): add 2 u_T max|v| over the
output's largest element.

One record per case: {"case": label, "ok": bool, "problem": str | None, ...}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from harness import UNIT_ROUNDOFF as U, Buffer, Context  # first: it puts the checkout (driver, ops) on sys.path

from driver.device import make_session  # noqa: E402
import ops.group_query_attention as gqa  # noqa: E402
from ops.group_query_attention import GqaConfig  # noqa: E402

NODE = "/model/layers.3/attn/GroupQueryAttention"
WIDTH_CONSISTENT = 16  # widths up to this are bit-identical to width-1 calls (the kernel's kRowsPerPass)
FLOATS = ("query", "key", "value", "past_key", "past_value")


@dataclass(frozen=True)
class Case:
    nq: int
    nkv: int
    h: int
    seq: int
    past: int
    spare: int = 8  # buffer positions after the call's
    dtype: str = "float16"
    batch: int = 1
    window: int = -1
    softcap: float = 0.0

    def config(self) -> GqaConfig:
        # random_case draws float32/float16 arrays; bfloat16 inputs are those float32 values rounded.
        return GqaConfig(self.nq, self.nkv, self.h, local_window_size=self.window, softcap=self.softcap,
                         dtype=self.dtype)

    def label(self) -> str:
        extra = (f" window={self.window}" if self.window > 0 else "") + (f" softcap={self.softcap}" if self.softcap else "")
        return f"{self.dtype} Nq={self.nq} Nkv={self.nkv} H={self.h} S={self.seq} past={self.past} B={self.batch}{extra}"


FIXED = [
    Case(24, 4, 256, 1, 100),  # the 27B-class layer: decode
    Case(24, 4, 256, 5, 100),  # verify of 4 drafts
    Case(24, 4, 256, 16, 100),
    Case(24, 4, 256, 37, 0, spare=3),  # a first prompt
    Case(24, 4, 256, 300, 0, spare=5),  # a longer prompt: several query and key tiles of the prefill kernel
    Case(24, 4, 256, 130, 70),  # a prefill chunk after cached positions (key tiles not aligned to the rows)
    Case(8, 2, 128, 77, 0, dtype="bfloat16", batch=2),
    Case(4, 2, 64, 90, 40, window=33, softcap=8.0),
    Case(4, 2, 32, 200, 0),  # the tiny preset's prompt
    Case(4, 2, 32, 3, 20, batch=2),  # the tiny preset
    Case(16, 2, 64, 9, 300, dtype="bfloat16"),  # several key chunks
    Case(8, 8, 128, 4, 130, dtype="float32", window=50),
    Case(4, 1, 48, 6, 12, softcap=5.0),
]


def random_cases(rng: np.random.Generator, n: int) -> list[Case]:
    cases = []
    for _ in range(n):
        nkv = int(rng.choice([1, 2, 4]))
        seq = int(rng.integers(1, 17)) if rng.random() < 0.85 else int(rng.integers(17, 70))
        past = int(rng.integers(0, 400))
        cases.append(Case(nkv * int(rng.choice([1, 2, 3, 6])), nkv, int(rng.choice([16, 32, 64, 96, 128, 256])), seq,
                          past, spare=int(rng.integers(0, 20)), dtype=str(rng.choice(["float16", "bfloat16", "float32"])),
                          batch=int(rng.choice([1, 1, 2])) if past == 0 or seq == 1 else 1,
                          window=int(rng.choice([-1, -1, -1, 33])), softcap=float(rng.choice([0.0, 0.0, 0.0, 8.0]))))
    return cases


def case_inputs(rng, case: Case) -> dict[str, np.ndarray]:
    base = GqaConfig(case.nq, case.nkv, case.h, dtype="float32" if case.dtype == "bfloat16" else case.dtype)
    x = gqa.random_case(rng, base, case.batch, case.seq, case.past, case.past + case.seq + case.spare)
    if case.dtype == "bfloat16":  # values exactly representable in bfloat16
        for name in FLOATS:
            bits = x[name].astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
            x[name] = bits.view(np.float32)
    return x


class Runner:
    def __init__(self, ctx: Context, case: Case, cpu: bool = True):
        self.ctx, self.case = ctx, case
        self.model = gqa.model(case.config(), node_name=NODE)
        self.session = make_session(ctx.device, self.model)
        self.cpu_session = make_session(ctx.cpu, self.model) if cpu else None

    def inputs(self, device, x) -> dict[str, Buffer]:
        bufs = {name: Buffer.upload(device, x[name], self.case.dtype) for name in FLOATS}
        bufs["seqlens_k"] = Buffer.upload(device, x["seqlens_k"], "int32")
        return bufs

    def outputs(self, device, x) -> dict[str, Buffer]:
        c = self.case
        length = max(int(x["total_sequence_length"]), x["past_key"].shape[2])
        return {"output": Buffer.poisoned(device, (c.batch, x["query"].shape[1], c.nq * c.h), c.dtype),
                "present_key": Buffer.poisoned(device, (c.batch, c.nkv, length, c.h), c.dtype),
                "present_value": Buffer.poisoned(device, (c.batch, c.nkv, length, c.h), c.dtype)}

    def run_buffers(self, bufs, total, outs, device=None, session=None) -> dict[str, Buffer]:
        device = device or self.ctx.device
        session = session or self.session
        binding = session.io_binding()
        for name, buf in bufs.items():
            buf.bind(binding, name)
        binding.bind_cpu_input("total_sequence_length", np.asarray(total, np.int32))
        for name, buf in outs.items():
            buf.bind(binding, name, output=True)
        session.run_with_iobinding(binding, device.run_options(None))
        device.synchronize()
        return outs

    def run(self, x, cpu: bool = False) -> dict[str, Buffer]:
        device, session = (self.ctx.cpu, self.cpu_session) if cpu else (self.ctx.device, self.session)
        return self.run_buffers(self.inputs(device, x), x["total_sequence_length"], self.outputs(device, x),
                                device, session)


def tolerance(case: Case, x) -> float:
    n = case.past + case.seq
    qk = float(np.abs(x["query"]).max() * np.abs(x["past_key"]).max()) / np.sqrt(case.h)
    return 4 * U[case.dtype] + 4 * (case.h + n) * U["float32"] * max(qk, 1.0)


def check_case(ctx: Context, case: Case) -> dict:
    x = case_inputs(ctx.rng, case)
    runner = Runner(ctx, case)
    got, want = runner.run(x), runner.run(x, cpu=True)
    problems = []
    g, w = got["output"].floats(), want["output"].floats()
    tol = tolerance(case, x)
    prefill = case.seq > WIDTH_CONSISTENT and case.dtype != "float32"
    if prefill:
        tol += 2 * U[case.dtype] * float(max(np.abs(x["value"]).max(), np.abs(x["past_value"]).max())) / max(float(np.abs(w).max()), 1e-30)
    ratio = None
    if np.isnan(g).any():
        problems.append(f"output: {int(np.isnan(g).sum())} elements NaN or unwritten")
    else:
        ratio = float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30) / tol)
        if ratio > 1:
            problems.append(f"output: max error {ratio:.3g} x the tolerance")
    for name in ("present_key", "present_value"):
        if not np.array_equal(got[name].raw(), want[name].raw()):
            problems.append(f"{name} differs from the CPU op's")
    bad = width_consistency(runner, x, got) if case.seq <= WIDTH_CONSISTENT else []
    if bad:
        problems.append(f"width {case.seq} differs from {case.seq} width-1 calls: {bad[:4]}")
    return {"case": case.label(), "ok": not problems, "problem": "; ".join(problems) or None, "shape": asdict(case),
            "err_over_tol": ratio, "output_bit_equal_cpu": float(np.mean(got["output"].bits() == want["output"].bits())),
            "width_consistent": not bad if case.seq <= WIDTH_CONSISTENT else None}


def width_consistency(runner: Runner, x, wide: dict[str, Buffer]) -> list[str]:
    device, case = runner.ctx.device, runner.case
    wide_out = wide["output"].bits()
    cache = {"past_key": Buffer.upload(device, x["past_key"], case.dtype),
             "past_value": Buffer.upload(device, x["past_value"], case.dtype)}
    bad = []
    for s in range(case.seq):
        step = {name: Buffer.upload(device, x[name][:, s:s + 1], case.dtype) for name in ("query", "key", "value")}
        step.update(cache)
        step["seqlens_k"] = Buffer.upload(device, np.full(case.batch, case.past + s, np.int32), "int32")
        total = case.past + s + 1
        outs = runner.outputs(device, {**x, "query": x["query"][:, :1], "total_sequence_length": np.array(total)})
        runner.run_buffers(step, total, outs)
        if not np.array_equal(outs["output"].bits(), wide_out[:, s:s + 1]):
            bad.append(f"row {s}")
        cache = {"past_key": outs["present_key"], "past_value": outs["present_value"]}
    n = case.past + case.seq
    for name in ("key", "value"):
        if not np.array_equal(cache[f"past_{name}"].bits()[:, :, :n], wide[f"present_{name}"].bits()[:, :, :n]):
            bad.append(f"present_{name}")
    return bad


def check_shared(ctx: Context, case: Case) -> dict:
    label = f"shared buffer: {case.label()}"
    x = case_inputs(ctx.rng, case)
    runner = Runner(ctx, case, cpu=False)
    device = ctx.device
    want = runner.run(x)
    bufs = runner.inputs(device, x)
    outs = runner.outputs(device, x)
    outs["present_key"], outs["present_value"] = bufs["past_key"], bufs["past_value"]
    runner.run_buffers(bufs, x["total_sequence_length"], outs)
    problems = []
    if not np.array_equal(outs["output"].raw(), want["output"].raw()):
        problems.append("output differs from the run into separate outputs")
    n = case.past + case.seq
    for name in ("key", "value"):
        got = bufs[f"past_{name}"].bits()
        if not np.array_equal(got[:, :, :n], want[f"present_{name}"].bits()[:, :, :n]):
            problems.append(f"present_{name}'s first {n} positions")
        original = Buffer.upload(device, x[f"past_{name}"], case.dtype).bits()
        if not np.array_equal(got[:, :, n:], original[:, :, n:]):
            problems.append(f"past_{name} changed after position {n}")
    return {"case": label, "ok": not problems, "problem": "; ".join(problems) or None, "shape": asdict(case)}


def check_bad_seqlens(ctx: Context) -> dict:
    """Batch row 1's seqlens_k past the end of the cache: its rows NaN, row 0 as alone, nothing else
    written (shared buffers: row 1's cache unchanged)."""
    case = Case(4, 2, 32, 1, 10, spare=2, batch=2)
    label = "seqlens_k past the cache: NaN rows, nothing written"
    x = case_inputs(ctx.rng, case)
    x["seqlens_k"] = np.array([10, 10_000], np.int32)
    runner = Runner(ctx, case, cpu=False)
    device = ctx.device
    bufs = runner.inputs(device, x)
    outs = runner.outputs(device, x)
    outs["present_key"], outs["present_value"] = bufs["past_key"], bufs["past_value"]
    if not ctx.on_gpu:  # the CPU op checks seqlens_k on the host: an error naming the node
        try:
            runner.run_buffers(bufs, x["total_sequence_length"], outs)
        except Exception as e:  # noqa: BLE001  (ORT's error is what is checked)
            ok = NODE in str(e) and "past the end of the KV cache" in str(e)
            return {"case": label, "ok": ok, "problem": None if ok else f"unexpected error: {e}"}
        return {"case": label, "ok": False, "problem": "the CPU op ran"}
    runner.run_buffers(bufs, x["total_sequence_length"], outs)
    out = outs["output"].floats()
    problems = []
    if not np.isnan(out[1]).all():
        problems.append("row 1's output is not NaN")
    if np.isnan(out[0]).any():
        problems.append("row 0's output has NaN")
    original = Buffer.upload(device, x["past_key"], case.dtype).bits()
    if not np.array_equal(bufs["past_key"].bits()[1], original[1]):
        problems.append("row 1's cache was written")
    return {"case": label, "ok": not problems, "problem": "; ".join(problems) or None}


SHARED = [Case(24, 4, 256, 5, 100), Case(4, 2, 32, 1, 0, batch=2, dtype="bfloat16")]


def check_group_query_attention(ctx: Context):
    for case in FIXED + random_cases(ctx.rng, ctx.random_cases):
        ctx.started(case.label())
        yield check_case(ctx, case)
    for case in SHARED:
        ctx.started(f"shared buffer: {case.label()}")
        yield check_shared(ctx, case)
    ctx.started("bad seqlens_k")
    yield check_bad_seqlens(ctx)
