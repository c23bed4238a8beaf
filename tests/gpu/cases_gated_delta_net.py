"""ort_mtp::GatedDeltaNet on the device: the checks of the gated-delta-net group.

The op is the whole linear-attention mixer of a Qwen3.5 layer (README.md, "Op reference"); its CUDA
kernel (csrc/gated_delta_net/gated_delta_net_cuda.cu) keeps each (batch, v head)'s state on chip in
float32 over the call's tokens and rounds at the CPU kernel's points. Every case has fresh random
weights and inputs (ops.gated_delta_net.random_weights / random_inputs) from the run's seed, runs the
one-node model with IOBinding on device buffers (bfloat16 bound as its bit patterns), every output
poisoned with NaN first (an element the kernel leaves unwritten fails), and, with a state window W,
the past slots below W-1 poisoned with NaN too (only slot W-1 may be read).

  1. CUDA against our CPU op (the exact reference kernel, double arithmetic): fixed cases (the
     27B-class layer Hk=16, Hv=48, dk=dv=128 at widths 1, 5, 16; the presets' shapes; odd head dims;
     Hk == Hv) and ctx.random_cases random ones (Hk < Hv and Hk == Hv, dk and dv in 16..128, S = 1..16
     and 37, W = 0 and 4, float16 / bfloat16 / float32, a float32 state, T-typed gate parameters,
     batch 1 and 2, conv kernel 2..6, with and without conv bias). present_conv (copies) must be
     bit-equal, the zero slots zeros, and y and present_recurrent within TOLERANCE (below).
  2. The same case's width-S call against S width-1 calls on the device, chained through the device
     state buffers: every y row and every state slot (conv and recurrent) bit-identical.
  3. In place: present_conv / present_recurrent bound to the past buffers, bit-equal to the run into
     separate outputs (the 27B-class layer at W = 4 and a small one at W = 0).
  4. ORT's CUDA graph: capture and replay with new activations and the last step's state written into
     the bound buffers before every step (past and present separate, as the driver binds them: ORT's
     first run of a graph id runs the model several times); each step bit-equal to a plain run from
     the same state.
  5. A head dim over 128 is refused at session creation on the CUDA EP, naming the node (GPU only).

TOLERANCE. Both kernels round at the same points (conv output, normed q and k, scaled q, g, beta, o, y,
the state after every token); between them the CUDA kernel computes in float32 where the CPU kernel
computes in double. So before each rounding the two values differ by float32 error, at most ~(2 dk +
K + 8) u_32 relative to the sum's magnitude (dot products of dk terms, the K-tap conv, a few
transcendental and scalar steps), and a rounding to T either agrees or flips by one unit, 2 u_T. The
recurrence does not amplify a difference (decay exp(g) <= 1; I - beta k k^T with |k| = 1 and beta in
[0, 1] has norm <= 1; a flip of g by one unit changes exp(g) S by at most 2 u_T |g| e^g <= 0.74 u_T |S|),
so per token the state and y differ by a few flips of 2 u_T plus the float32 error, and the differences
add up over the tokens. Allowed, relative to the tensor's largest element:

    (8 + 2 S) u_T + S (2 dk + K + 8) u_32            u_T: 2^-24 float32, 2^-11 float16, 2^-8 bfloat16

(the bound tests/test_gated_delta_net.py states for a float32-accumulating kernel). Before the first
device run, a numpy float32 model of this arithmetic came within 0.11 of it on a grid of these shapes
(widths up to 37), and the kernel's own code run on the host (threads emulated) within 0.04. For
float16 and bfloat16 at least 75% of y's elements must also be bit-equal to the CPU op's (95-100% on
that grid: most roundings agree; a rounding point missing or added breaks that). Each record has the error over the
tolerance (cuda.max_err_over_tol) and the bit-equal fractions.

One record per case: {"case": label, "ok": bool, "problem": str | None, ...}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from harness import UNIT_ROUNDOFF, Buffer, Context  # first: it puts the checkout (driver, ops) on sys.path

from driver.device import make_session  # noqa: E402
import ops.gated_delta_net as gdn  # noqa: E402
from ops.gated_delta_net import GdnConfig  # noqa: E402

NODE = "/model/layers.0/linear_attn/GatedDeltaNet"
STEP_INPUTS = ("qkv", "z", "a", "b")
STATES = ("past_conv", "past_recurrent")
PRESENT = {"past_conv": "present_conv", "past_recurrent": "present_recurrent"}
MIN_BIT_EQUAL_Y = 0.75  # float16 / bfloat16: y elements bit-equal to the CPU op's


@dataclass(frozen=True)
class Case:
    hk: int
    hv: int
    dk: int
    dv: int
    seq: int
    window: int = 0
    dtype: str = "float16"
    state_dtype: str | None = None  # None: T
    gate_dtype: str = "float32"
    batch: int = 1
    conv_kernel: int = 4
    conv_bias: bool = True

    def config(self) -> GdnConfig:
        return GdnConfig(self.hk, self.hv, self.dk, self.dv, conv_kernel=self.conv_kernel,
                         state_window=self.window, dtype=self.dtype, state_dtype=self.state_dtype,
                         gate_dtype=self.gate_dtype, epsilon=1e-6)

    def label(self) -> str:
        extra = "".join([f" state={self.state_dtype}" if self.state_dtype else "",
                         f" gates={self.gate_dtype}" if self.gate_dtype != "float32" else "",
                         f" K={self.conv_kernel}" if self.conv_kernel != 4 else "",
                         "" if self.conv_bias else " no-bias"])
        return (f"{self.dtype} Hk={self.hk} Hv={self.hv} dk={self.dk} dv={self.dv} S={self.seq} W={self.window} "
                f"B={self.batch}{extra}")


FIXED = [
    Case(16, 48, 128, 128, 1, 4, "float16"),          # the 27B-class layer: decode
    Case(16, 48, 128, 128, 5, 4, "float16"),          # verify of 4 drafts
    Case(16, 48, 128, 128, 16, 4, "float16"),         # two chunks of shared-memory features
    Case(16, 48, 128, 128, 3, 4, "bfloat16", batch=2),
    Case(16, 48, 128, 128, 4, 0, "float16", state_dtype="float32"),
    Case(2, 4, 32, 32, 3, 4, "float16", batch=2),     # the tiny preset
    Case(8, 16, 64, 64, 37, 0, "bfloat16"),           # the small preset, a prefill chunk
    Case(4, 4, 128, 128, 16, 0, "bfloat16", gate_dtype="bfloat16"),  # Hk == Hv
    Case(2, 6, 20, 36, 37, 0, "float32", batch=2, conv_bias=False),  # odd dims, fp32
    Case(1, 3, 128, 17, 2, 4, "float16", gate_dtype="float16"),      # odd dv: element accesses
    Case(2, 4, 16, 16, 9, 4, "float32", conv_kernel=2),
    Case(3, 3, 100, 128, 6, 4, "float16", state_dtype="float32", conv_kernel=6, batch=2),
]

DIMS = (16, 32, 48, 64, 96, 128)


def random_cases(rng: np.random.Generator, n: int) -> list[Case]:
    cases = []
    for _ in range(n):
        def dim():
            return int(rng.choice(DIMS)) if rng.random() < 0.7 else int(rng.integers(16, 129))
        hk = int(rng.choice([1, 2, 4]))
        hv = hk * int(rng.choice([1, 2, 3]))
        dtype = str(rng.choice(["float16", "bfloat16", "float32"]))
        state = "float32" if dtype != "float32" and rng.random() < 0.3 else None
        gates = dtype if dtype != "float32" and rng.random() < 0.3 else "float32"
        seq = int(rng.integers(1, 17)) if rng.random() < 0.85 else 37
        cases.append(Case(hk, hv, dim(), dim(), seq, int(rng.choice([0, 4])), dtype, state, gates,
                          batch=int(rng.choice([1, 2])), conv_kernel=int(rng.choice([4, 4, 4, 2, 6])),
                          conv_bias=bool(rng.random() < 0.8)))
    return cases


def tolerance(cfg: GdnConfig, seq: int) -> float:
    """Allowed difference from the CPU op relative to the tensor's largest element (module docstring)."""
    return (8 + 2 * seq) * UNIT_ROUNDOFF[cfg.dtype] + seq * (2 * cfg.k_head_dim + cfg.conv_kernel + 8) * 2.0**-24


# ---------------------------------------------------------------------------------------------------
# Running the one-node model on device buffers

class GdnRunner:
    """One case's one-node model (weights as initializers, node named NODE) on the device under test
    and, with cpu=True, on the CPU EP. graph: the device session captures ORT CUDA graphs."""

    def __init__(self, ctx: Context, cfg: GdnConfig, w: gdn.GdnWeights, graph: bool = False, cpu: bool = True):
        self.ctx, self.cfg = ctx, cfg
        model = gdn.gated_delta_net_model(cfg, w, node_name=NODE)
        self.session = make_session(ctx.device, model, graph_capture=graph)
        self.cpu_session = make_session(ctx.cpu, model) if cpu else None

    def inputs(self, device, values: dict[str, np.ndarray]) -> dict[str, Buffer]:
        return {name: Buffer.upload(device, v, gdn.input_dtype(self.cfg, name)) for name, v in values.items()}

    def outputs(self, device, batch: int, seq: int) -> dict[str, Buffer]:
        cfg = self.cfg
        shapes = {"y": (batch, seq, cfg.value_dim), "present_conv": tuple(cfg.conv_state_shape(batch)),
                  "present_recurrent": tuple(cfg.recurrent_state_shape(batch))}
        return {name: Buffer.poisoned(device, shape, gdn.output_dtype(cfg, name)) for name, shape in shapes.items()}

    def binding(self, session, inputs: dict[str, Buffer], outputs: dict[str, Buffer]):
        binding = session.io_binding()
        for name, buf in inputs.items():
            buf.bind(binding, name)
        for name, buf in outputs.items():
            buf.bind(binding, name, output=True)
        return binding

    def run(self, values: dict[str, np.ndarray], cpu: bool = False) -> dict[str, Buffer]:
        """The outputs for host input arrays, on the device (or the CPU EP), into poisoned buffers."""
        device, session = (self.ctx.cpu, self.cpu_session) if cpu else (self.ctx.device, self.session)
        bufs = self.inputs(device, values)
        return self.run_buffers(bufs, device, session)

    def run_buffers(self, inputs: dict[str, Buffer], device=None, session=None, outputs=None,
                    graph_id: int | None = None) -> dict[str, Buffer]:
        device = device or self.ctx.device
        session = session or self.session
        batch, seq = inputs["qkv"].shape[:2]
        outputs = outputs or self.outputs(device, batch, seq)
        session.run_with_iobinding(self.binding(session, inputs, outputs), device.run_options(graph_id))
        device.synchronize()
        return outputs


def case_data(rng, case: Case):
    """(config, weights, inputs), the past slots below W-1 NaN (the op must not read them)."""
    cfg = case.config()
    w = gdn.random_weights(rng, cfg, conv_bias=case.conv_bias)
    x = gdn.random_inputs(rng, cfg, case.batch, case.seq)
    if case.window:
        for name in STATES:
            x[name][:case.window - 1] = np.nan
    return cfg, w, x


def step_slice(x: dict[str, np.ndarray], t: int) -> dict[str, np.ndarray]:
    return {name: x[name][:, t:t + 1] for name in STEP_INPUTS}


# ---------------------------------------------------------------------------------------------------
# Checks

def compare_with_cpu(cfg: GdnConfig, seq: int, got: dict[str, Buffer], want: dict[str, Buffer]) -> dict:
    """The device outputs against the CPU op's: errors over the tolerance, bit-equal fractions, and
    the problems found (empty when the case passes)."""
    tol = tolerance(cfg, seq)
    slots = max(cfg.state_window, 1)
    zero_slots = max(0, slots - seq)
    result = {"tolerance": tol, "problems": []}
    worst = 0.0
    for name in ("y", "present_recurrent"):
        g, w_ = got[name].floats(), want[name].floats()
        if np.isnan(g).any():
            result["problems"].append(f"{name}: {int(np.isnan(g).sum())} elements unwritten (NaN) or NaN")
            continue
        scale = max(float(np.abs(w_).max()), 1e-30)
        ratio = float(np.abs(g - w_).max() / scale / tol)
        worst = max(worst, ratio)
        result[f"{name}_err_over_tol"] = ratio
        result[f"{name}_bit_equal"] = float(np.mean(got[name].bits() == want[name].bits()))
        if ratio > 1:
            result["problems"].append(f"{name}: max error {ratio:.3g} x the tolerance")
    if cfg.dtype != "float32" and result.get("y_bit_equal", 1.0) < MIN_BIT_EQUAL_Y:
        result["problems"].append(f"y: only {result['y_bit_equal']:.3f} of the elements bit-equal to the CPU op's")
    conv_got, conv_want = got["present_conv"].raw(), want["present_conv"].raw()
    if not np.array_equal(conv_got, conv_want):
        result["problems"].append("present_conv differs from the CPU op's")
    if zero_slots:
        for name in ("present_conv", "present_recurrent"):
            if got[name].raw()[:zero_slots].any():
                result["problems"].append(f"{name}: slots below W-S not zero")
    result["max_err_over_tol"] = worst
    return result


def width_consistency(runner: GdnRunner, cfg: GdnConfig, x: dict[str, np.ndarray], wide: dict[str, Buffer]) -> list:
    """S width-1 calls from the same state, chained through the device state buffers, against the
    width-S call: every y row and every state slot bitwise. Returns the mismatches."""
    device, seq, slots = runner.ctx.device, x["qkv"].shape[1], max(cfg.state_window, 1)
    wide_y = wide["y"].bits()
    wide_state = {name: wide[PRESENT[name]].bits() for name in STATES}
    state = runner.inputs(device, {name: x[name] for name in STATES})
    bad = []
    for t in range(seq):
        out = runner.run_buffers({**runner.inputs(device, step_slice(x, t)), **state})
        if not np.array_equal(out["y"].bits(), wide_y[:, t:t + 1]):
            bad.append(f"y row {t}")
        j = t - (seq - slots)  # the wide call's slot holding the state after token t
        if j >= 0:
            for name in STATES:
                step_bits = out[PRESENT[name]].bits()
                step_slot = step_bits[slots - 1] if cfg.state_window else step_bits
                wide_slot = wide_state[name][j] if cfg.state_window else wide_state[name]
                if not np.array_equal(step_slot, wide_slot):
                    bad.append(f"{PRESENT[name]} after token {t}")
        state = {name: out[PRESENT[name]] for name in STATES}
    return bad


def check_case(ctx: Context, case: Case) -> dict:
    cfg, w, x = case_data(ctx.rng, case)
    runner = GdnRunner(ctx, cfg, w)
    got = runner.run(x)
    want = runner.run(x, cpu=True)
    cmp = compare_with_cpu(cfg, case.seq, got, want)
    problems = cmp.pop("problems")
    width_bad = width_consistency(runner, cfg, x, got)
    if width_bad:
        problems.append(f"width {case.seq} differs from {case.seq} width-1 calls: {width_bad[:4]}"
                        + (f" and {len(width_bad) - 4} more" if len(width_bad) > 4 else ""))
    return {"case": case.label(), "ok": not problems, "problem": "; ".join(problems) or None,
            "shape": asdict(case), "cuda": cmp, "width_consistent": not width_bad}


def check_in_place(ctx: Context, case: Case) -> dict:
    """present bound to the past buffers: the same bytes as a run into separate outputs."""
    label = f"in place: {case.label()}"
    cfg, w, x = case_data(ctx.rng, case)
    runner = GdnRunner(ctx, cfg, w, cpu=False)
    device = ctx.device
    want = runner.run(x)
    bufs = runner.inputs(device, x)
    outs = runner.outputs(device, case.batch, case.seq)
    outs.update({PRESENT[name]: bufs[name] for name in STATES})
    runner.run_buffers(bufs, outputs=outs)
    problems = [name for name in ("y", "present_conv", "present_recurrent")
                if not np.array_equal(outs[name].raw(), want[name].raw())]
    return {"case": label, "ok": not problems, "shape": asdict(case),
            "problem": f"differs from the run into separate outputs: {problems}" if problems else None}


def check_graph(ctx: Context, case: Case, steps: int = 4) -> dict:
    """Under ORT's CUDA graph (on the GPU): activations and state in bound buffers (past and present
    separate, as the driver double-buffers them), new activations and the last step's present state
    written into the bound past buffers before every step (the first run, the capture, replays); each
    step's y and state bit-equal to a plain session's run from the same state.

    Not in place: under enable_cuda_graph, ORT's first Run of a graph id runs the model more than once
    before it returns (warm-up runs, then the capture and its replay), so a state updated in place
    advances several tokens in that call (device run of 2026-12-02: step 0 differed, the replays were
    equal). The driver binds past and present to different buffers (driver/runner.py), which makes the
    repeated runs idempotent; in place is checked in plain sessions (check_in_place)."""
    label = f"CUDA graph, state double-buffered: {case.label()}"
    cfg, w, x = case_data(ctx.rng, case)
    device = ctx.device
    graph = GdnRunner(ctx, cfg, w, graph=ctx.on_gpu, cpu=False)
    plain = GdnRunner(ctx, cfg, w, cpu=False)
    bufs = graph.inputs(device, x)
    outs = graph.outputs(device, case.batch, case.seq)
    binding = graph.binding(graph.session, bufs, outs)
    bad = []
    for step in range(steps):
        if step:
            fresh = gdn.random_inputs(ctx.rng, cfg, case.batch, case.seq)
            for name in STEP_INPUTS:
                bufs[name].write(fresh[name])
            for name in STATES:
                bufs[name].write(outs[PRESENT[name]].floats())
        before = {name: bufs[name].floats() for name in (*STEP_INPUTS, *STATES)}
        want = plain.run({name: v.astype(np.float32) for name, v in before.items()})
        for name in ("y", *PRESENT.values()):
            outs[name].fill_nan()
        graph.session.run_with_iobinding(binding, device.run_options(1 if ctx.on_gpu else None))
        device.synchronize()
        for name in ("y", "present_conv", "present_recurrent"):
            if not np.array_equal(outs[name].raw(), want[name].raw()):
                bad.append(f"step {step} {name}")
    return {"case": label, "ok": not bad, "shape": asdict(case), "steps": steps,
            "problem": f"differs from plain runs: {bad}" if bad else None}


def check_refused(ctx: Context) -> dict:
    """k_head_dim 192 (over the CUDA kernel's 128): session creation fails on the CUDA EP, naming the node."""
    label = "dk=192 refused at session creation on the CUDA EP"
    cfg = GdnConfig(1, 2, 192, 64, dtype="float16")
    w = gdn.random_weights(np.random.default_rng(0), cfg)
    try:
        make_session(ctx.device, gdn.gated_delta_net_model(cfg, w, node_name=NODE))
    except Exception as e:  # noqa: BLE001  (ORT's error is what is checked)
        message = str(e)
        ok = NODE in message and "128" in message
        return {"case": label, "ok": ok, "error": message[:500],
                "problem": None if ok else "the error does not name the node and the limit"}
    return {"case": label, "ok": False, "problem": "the session was created"}


IN_PLACE = [Case(16, 48, 128, 128, 4, 4, "float16"), Case(2, 6, 32, 64, 5, 0, "bfloat16", batch=2),
            Case(2, 4, 64, 64, 2, 4, "float32", state_dtype=None, batch=2)]
GRAPH = [Case(16, 48, 128, 128, 4, 4, "float16"), Case(2, 4, 32, 32, 1, 0, "bfloat16", batch=2)]


def check_gated_delta_net(ctx: Context):
    """The cases of the module docstring; one record per case."""
    for case in FIXED + random_cases(ctx.rng, ctx.random_cases):
        ctx.started(case.label())
        yield check_case(ctx, case)
    for case in IN_PLACE:
        ctx.started(f"in place: {case.label()}")
        yield check_in_place(ctx, case)
    for case in GRAPH:
        ctx.started(f"CUDA graph, state double-buffered: {case.label()}")
        yield check_graph(ctx, case)
    if ctx.on_gpu:
        ctx.started("dk=192 refused")
        yield check_refused(ctx)
