"""Where a CPU decode step and an MTP round spend their time: ONNX Runtime's profiler on the driver's
own sessions (kernel time per op type, per decode step and for the prefill), then the driver's
profiler (ms per round per phase) for MTP at each k, and the main graph's runs of MTP k=1 per width (a
width-2 verify against a width-1 step, op by op).

    python bench/cpu_op_profile.py --model /tmp/small [--new-tokens 24] [--threads 2] [--out FILE]

The model folder is e.g. `python -m models build --preset small --ep cpu --precision int4 --out /tmp/small`.
The greedy pass: a 32-token prompt, then --new-tokens decode steps with profiling on (ORT's per-node
timing adds a little to each node). The MTP passes: the same prompt, --mode mtp with the driver's
profiler (a synchronisation per phase; on the CPU that costs nothing extra).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402

import driver.sessions as sessions  # noqa: E402
from driver import Generator  # noqa: E402
from cpu import run_record  # noqa: E402  (bench/cpu.py: a result's opening)

PROMPT = list(range(3, 35))


def _profiled_runs(model: Path, new_tokens: int, threads: int, draft_tokens: int = 0) -> tuple[float, list]:
    """Generates with ORT's profiler on the main graph's session (greedy, or MTP with draft_tokens);
    returns the tok/s and, per main-graph run in order, (width: the rows of A of its first MatMulNBits
    node, run microseconds, Counter of kernel microseconds per op type)."""
    folder = tempfile.mkdtemp()
    real = sessions.ort.SessionOptions

    class Profiling(real):
        def __init__(self):
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = os.path.join(folder, "main")

    sessions.ort.SessionOptions = Profiling
    try:
        gen = Generator(model, provider="cpu", mode="mtp" if draft_tokens else "greedy",
                        draft_tokens=max(draft_tokens, 1), max_length=256, threads=threads)
    finally:
        sessions.ort.SessionOptions = real
    result = gen.generate(PROMPT, new_tokens, draft_tokens=max(draft_tokens, 1), stop_at_eos=False)
    tok_s = result.stats.as_dict()["tokens_per_second"]
    events = json.load(open(gen.main.session.end_profiling()))  # the main graph's profile file
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    out, i = [], 0
    for run in runs:
        ops, width = collections.Counter(), None
        while i < len(nodes) and nodes[i]["ts"] < run["ts"]:
            i += 1
        while i < len(nodes) and nodes[i]["ts"] <= run["ts"] + run["dur"]:
            e = nodes[i]
            op = e["args"].get("op_name")
            ops[op] += e["dur"]
            if width is None and op == "MatMulNBits":
                shape = e["args"].get("input_type_shape") or [{}]
                dims = next(iter(shape[0].values()), None)
                width = dims[-2] if dims and len(dims) >= 2 else None
            i += 1
        out.append((width, run["dur"], ops))
    return tok_s, out


def op_profile(model: Path, new_tokens: int, threads: int) -> dict:
    """Kernel ms per op type: the prefill run, and the mean of the decode runs."""
    tok_s, runs = _profiled_runs(model, new_tokens, threads)
    (_, prefill_us, prefill), decode = runs[0], runs[1:]
    steps = collections.Counter()
    for _, _, ops in decode:
        steps.update(ops)
    n = len(decode)
    return {"greedy_tok_s_while_profiling": tok_s, "decode_steps": n,
            "decode_ms_per_step": round(sum(d for _, d, _ in decode) / n / 1000, 3),
            "decode_kernel_ms_per_step": {k: round(v / n / 1000, 3) for k, v in steps.most_common()},
            "prefill_ms": round(prefill_us / 1000, 3),
            "prefill_kernel_ms": {k: round(v / 1000, 3) for k, v in prefill.most_common()}}


def width_profile(model: Path, new_tokens: int, threads: int, draft_tokens: int) -> dict:
    """MTP at draft_tokens: the main graph's runs after the prefill grouped by width (1: a decode or a
    re-advance of one row, k + 1: a verify, ...), ms per run and kernel ms per op type per run."""
    tok_s, runs = _profiled_runs(model, new_tokens, threads, draft_tokens)
    groups: dict = {}
    for width, dur, ops in runs[1:]:
        g = groups.setdefault(str(width), {"runs": 0, "us": 0, "ops": collections.Counter()})
        g["runs"] += 1
        g["us"] += dur
        g["ops"].update(ops)
    return {"tok_s_while_profiling": tok_s, "by_width": {
        w: {"runs": g["runs"], "ms_per_run": round(g["us"] / g["runs"] / 1000, 3),
            "kernel_ms_per_run": {k: round(v / g["runs"] / 1000, 3) for k, v in g["ops"].most_common()}}
        for w, g in sorted(groups.items())}}


def round_profile(model: Path, new_tokens: int, threads: int) -> dict:
    out = {}
    for k in (1, 2, 3):  # a Generator per k, as the CLI makes one (its state window: k + 1 slots)
        gen = Generator(model, provider="cpu", mode="mtp", draft_tokens=k, max_length=256, threads=threads,
                        profile=True)
        gen.generate(PROMPT, 8, draft_tokens=k, stop_at_eos=False)
        s = gen.generate(PROMPT, new_tokens, draft_tokens=k, stop_at_eos=False).stats.as_dict()
        out[f"mtp_k{k}"] = {"tok_s": s["tokens_per_second"], "acceptance": s["acceptance"],
                            "commits": s["commits"], "phase_ms_per_round": s["phase_ms_per_round"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file (default: print only)")
    args = ap.parse_args()
    model = Path(args.model)
    result = run_record(library=os.environ.get("ORT_MTP_LIBRARY", "installed"), onnxruntime=ort.__version__,
                        greedy=op_profile(model, args.new_tokens, args.threads),
                        mtp=round_profile(model, args.new_tokens, args.threads),
                        mtp_k1_by_width=width_profile(model, args.new_tokens, args.threads, 1))
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
