"""ort_mtp::GatedAttention on the device: the checks of the gated-attention group (the CUDA kernel,
csrc/attention/gated_attention_cuda.cu).

Every case has fresh random inputs from the run's seed (ops.gated_attention.random_case: `past` cached
positions in a longer buffer, S new tokens, the three MRoPE streams at distinct positions), runs the
one-node model with IOBinding on device buffers, outputs poisoned with NaN first.

  1. CUDA against our CPU op (double arithmetic): the 27B-class layer (Nq=24, Nkv=4, H=256, rotary 64,
     mrope_section (11, 11, 10) interleaved, fp16) at S = 1, 5, 16 over 100 cached positions, the small
     and tiny presets' shapes, bf16 and fp32, a sectioned layout, batch 2. The cache within
     cache_tolerance (the keys are computed, not copied: float32 against double); the output within
     TOLERANCE.
  2. The width-S call against S width-1 calls on the device (S <= 16), each step's present the next
     step's past: every output row and the cache bit-identical.
  3. A position past the cos/sin caches: that token's rows are NaN (the CPU op, in a dry run, refuses
     it with an error naming the node).

TOLERANCE. q and k differ from the CPU op's by about one unit of T (float32 norms and rotary against
double, both rounded to T), which moves each score by ~2 u_T |q||k| scale; the GroupQueryAttention part
adds its own group's bound: 4 u_T + 4 (H + n) u_32 max|q| max|k| scale, here with 4 u_T more for the
q/k rounding and 2 u_T for the gate, relative to the output's largest element.

One record per case: {"case": label, "ok": bool, "problem": str | None, ...}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from harness import UNIT_ROUNDOFF as U, Buffer, Context  # first: it puts the checkout (driver, ops) on sys.path

from driver.device import make_session  # noqa: E402
import ops.gated_attention as ga  # noqa: E402

NODE = "/model/layers.3/attn/GatedAttention"
FLOATS = ("qkv", "past_key", "past_value", "q_norm_weight", "k_norm_weight")


@dataclass(frozen=True)
class Case:
    nq: int
    nkv: int
    h: int
    rot: int
    section: tuple
    seq: int
    past: int
    layout: int = 1
    dtype: str = "float16"
    batch: int = 1
    spare: int = 8

    def config(self) -> ga.GatedAttentionConfig:
        return ga.GatedAttentionConfig(self.nq, self.nkv, self.h, self.rot, self.section, self.layout, dtype=self.dtype)

    def label(self) -> str:
        return (f"{self.dtype} Nq={self.nq} Nkv={self.nkv} H={self.h} rot={self.rot} layout={self.layout} "
                f"S={self.seq} past={self.past} B={self.batch}")


FIXED = [
    Case(24, 4, 256, 64, (11, 11, 10), 1, 100),  # the 27B-class layer: decode
    Case(24, 4, 256, 64, (11, 11, 10), 5, 100),  # verify of 4 drafts
    Case(24, 4, 256, 64, (11, 11, 10), 16, 100),
    Case(24, 4, 256, 64, (11, 11, 10), 40, 0),  # a prompt
    Case(8, 2, 128, 32, (6, 5, 5), 3, 30, dtype="bfloat16"),  # the small preset
    Case(4, 2, 64, 16, (4, 2, 2), 4, 9, dtype="float32", batch=2),  # the trained default model
    Case(4, 2, 32, 8, (2, 1, 1), 2, 20, layout=0),  # the tiny preset, sectioned
]


def case_inputs(rng, case: Case) -> dict[str, np.ndarray]:
    base = ga.GatedAttentionConfig(case.nq, case.nkv, case.h, case.rot, case.section, case.layout,
                                   dtype="float32" if case.dtype == "bfloat16" else case.dtype)
    x = ga.random_case(rng, base, case.batch, case.seq, case.past, case.past + case.seq + case.spare,
                       max_position=case.past + case.seq + 16)
    if case.dtype == "bfloat16":  # values exactly representable in bfloat16
        for name in FLOATS:
            x[name] = (x[name].astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return x


class Runner:
    def __init__(self, ctx: Context, case: Case):
        self.ctx, self.case = ctx, case
        model = ga.model(case.config(), node_name=NODE)
        self.session = make_session(ctx.device, model)
        self.cpu_session = make_session(ctx.cpu, model)

    def run(self, x, cpu: bool = False, cache=None) -> dict[str, Buffer]:
        c = self.case
        device, session = (self.ctx.cpu, self.cpu_session) if cpu else (self.ctx.device, self.session)
        bufs = {name: Buffer.upload(device, x[name], c.dtype) for name in FLOATS}
        if cache is not None:
            bufs["past_key"], bufs["past_value"] = cache
        bufs["seqlens_k"] = Buffer.upload(device, x["seqlens_k"], "int32")
        bufs["position_ids"] = Buffer.upload(device, x["position_ids"], "int64")
        for name in ("cos_cache", "sin_cache"):
            bufs[name] = Buffer.upload(device, x[name], "float32")
        length = max(int(x["total_sequence_length"]), x["past_key"].shape[2])
        seq = x["qkv"].shape[1]
        outs = {"output": Buffer.poisoned(device, (c.batch, seq, c.nq * c.h), c.dtype),
                "present_key": Buffer.poisoned(device, (c.batch, c.nkv, length, c.h), c.dtype),
                "present_value": Buffer.poisoned(device, (c.batch, c.nkv, length, c.h), c.dtype)}
        binding = session.io_binding()
        for name, buf in bufs.items():
            buf.bind(binding, name)
        binding.bind_cpu_input("total_sequence_length", np.asarray(x["total_sequence_length"], np.int32))
        for name, buf in outs.items():
            buf.bind(binding, name, output=True)
        session.run_with_iobinding(binding, device.run_options(None))
        device.synchronize()
        return outs


def tolerance(case: Case, x) -> float:
    n = case.past + case.seq
    return 10 * U[case.dtype] + 4 * (case.h + n) * U["float32"] * 8.0  # q, k are unit-RMS after the norm


def cache_tolerance(case: Case) -> float:
    """The new keys' bound, relative to the cache's largest element: both sides round to T (2 u_T); the
    device's float32 arithmetic adds the norm's H-term sum of squares (log2 H + 1 roundings in its fixed
    tree), the reciprocal square root and the weight (~5 more), and the rotary's two products and sum
    over two elements (~6 more, times |cos| + |sin| <= sqrt 2): (log2 H + 16) u_32 covers it. Negligible
    against u_T for 16-bit T; for float32 it is the whole bound (the values are copied for v: exact)."""
    return 2 * U[case.dtype] + (np.log2(case.h) + 16) * U["float32"]


def check_case(ctx: Context, case: Case) -> dict:
    x = case_inputs(ctx.rng, case)
    runner = Runner(ctx, case)
    got, want = runner.run(x), runner.run(x, cpu=True)
    problems = []
    g, w = got["output"].floats(), want["output"].floats()
    ratio = None
    if np.isnan(g).any():
        problems.append(f"output: {int(np.isnan(g).sum())} elements NaN or unwritten")
    else:
        ratio = float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30) / tolerance(case, x))
        if ratio > 1:
            problems.append(f"output: max error {ratio:.3g} x the tolerance")
    for name in ("present_key", "present_value"):
        gk, wk = got[name].floats(), want[name].floats()
        scale = max(float(np.abs(wk).max()), 1.0)
        err = float(np.abs(gk - wk).max()) / scale
        if np.isnan(gk).any() or err > cache_tolerance(case):
            problems.append(f"{name} differs from the CPU op's by {err / U[case.dtype]:.3g} units of {case.dtype} "
                            f"(bound {cache_tolerance(case) / U[case.dtype]:.3g})")
    bad = width_consistency(runner, x, got) if case.seq <= 16 else []
    if bad:
        problems.append(f"width {case.seq} differs from {case.seq} width-1 calls: {bad[:4]}")
    return {"case": case.label(), "ok": not problems, "problem": "; ".join(problems) or None, "shape": asdict(case),
            "err_over_tol": ratio, "width_consistent": not bad if case.seq <= 16 else None}


def width_consistency(runner: Runner, x, wide: dict[str, Buffer]) -> list[str]:
    case = runner.case
    cache = None
    bad = []
    for s in range(case.seq):
        step = dict(x, qkv=x["qkv"][:, s:s + 1], position_ids=x["position_ids"][:, :, s:s + 1],
                    seqlens_k=np.full(case.batch, case.past + s, np.int32),
                    total_sequence_length=np.array(case.past + s + 1, np.int32))
        outs = runner.run(step, cache=cache)
        if not np.array_equal(outs["output"].bits(), wide["output"].bits()[:, s:s + 1]):
            bad.append(f"row {s}")
        cache = (outs["present_key"], outs["present_value"])
    n = case.past + case.seq
    for i, name in enumerate(("present_key", "present_value")):
        if not np.array_equal(cache[i].bits()[:, :, :n], wide[name].bits()[:, :, :n]):
            bad.append(name)
    return bad


def check_bad_position(ctx: Context) -> dict:
    case = Case(4, 2, 32, 8, (2, 1, 1), 2, 5)
    label = "position past the cos/sin caches: NaN rows"
    x = case_inputs(ctx.rng, case)
    x["position_ids"] = x["position_ids"].copy()
    x["position_ids"][0, 0, 1] = 10_000
    runner = Runner(ctx, case)
    if not ctx.on_gpu:  # the CPU op checks position ids on the host: an error naming the node
        try:
            runner.run(x)
        except Exception as e:  # noqa: BLE001  (ORT's error is what is checked)
            ok = NODE in str(e) and "outside the cos/sin caches" in str(e)
            return {"case": label, "ok": ok, "problem": None if ok else f"unexpected error: {e}"}
        return {"case": label, "ok": False, "problem": "the CPU op ran"}
    out = runner.run(x)["output"].floats()
    problems = []
    if not np.isnan(out[0, 1]).all():
        problems.append("token 1's output is not NaN")
    if np.isnan(out[0, 0]).any():
        problems.append("token 0's output has NaN")
    return {"case": label, "ok": not problems, "problem": "; ".join(problems) or None}


def check_gated_attention(ctx: Context):
    for case in FIXED:
        ctx.started(case.label())
        yield check_case(ctx, case)
    ctx.started("bad position")
    yield check_bad_position(ctx)
