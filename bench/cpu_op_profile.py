"""Where a CPU decode step and an MTP round spend their time: ONNX Runtime's profiler on the driver's
own sessions (kernel time per op type, per decode step and for the prefill), then the driver's
profiler (ms per round per phase) for MTP at each k.

    python bench/cpu_op_profile.py --model /tmp/small [--new-tokens 24] [--threads 2] [--out FILE]

The model folder is e.g. `python -m models build --preset small --ep cpu --precision int4 --out /tmp/small`.
The greedy pass: a 32-token prompt, then --new-tokens decode steps with profiling on (ORT's per-node
timing adds a little to each node). The MTP passes: the same prompt, --mode mtp with the driver's
profiler (a synchronisation per phase; on the CPU that costs nothing extra).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402

import driver.sessions as sessions  # noqa: E402
from driver import Generator  # noqa: E402

PROMPT = list(range(3, 35))


def op_profile(model: Path, new_tokens: int, threads: int) -> dict:
    """Kernel ms per op type: the prefill run, and the mean of the decode runs."""
    folder = tempfile.mkdtemp()
    real = sessions.ort.SessionOptions

    class Profiling(real):
        def __init__(self):
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = os.path.join(folder, "main")

    sessions.ort.SessionOptions = Profiling
    try:
        gen = Generator(model, provider="cpu", mode="greedy", max_length=256, threads=threads)
    finally:
        sessions.ort.SessionOptions = real
    result = gen.generate(PROMPT, new_tokens, stop_at_eos=False)
    tok_s = result.stats.as_dict()["tokens_per_second"]
    events = json.load(open(gen.main.session.end_profiling()))  # the main graph's profile file
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    first, decode = runs[0], runs[1:]
    prefill, steps = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"].get("op_name")
            (prefill if first["ts"] <= e["ts"] <= first["ts"] + first["dur"] else steps)[op] += e["dur"]
    n = len(decode)
    return {"greedy_tok_s_while_profiling": tok_s, "decode_steps": n,
            "decode_ms_per_step": round(sum(r["dur"] for r in decode) / n / 1000, 3),
            "decode_kernel_ms_per_step": {k: round(v / n / 1000, 3) for k, v in steps.most_common()},
            "prefill_ms": round(first["dur"] / 1000, 3),
            "prefill_kernel_ms": {k: round(v / 1000, 3) for k, v in prefill.most_common()}}


def round_profile(model: Path, new_tokens: int, threads: int) -> dict:
    gen = Generator(model, provider="cpu", mode="mtp", max_length=256, threads=threads, profile=True)
    out = {}
    for k in (1, 2, 3):
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
    result = {"command": "python bench/cpu_op_profile.py " + " ".join(sys.argv[1:]),
              "date": datetime.date.today().isoformat(),
              "revision": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                         cwd=ROOT).stdout.strip(),
              "library": os.environ.get("ORT_MTP_LIBRARY", "installed"), "onnxruntime": ort.__version__,
              "greedy": op_profile(model, args.new_tokens, args.threads),
              "mtp": round_profile(model, args.new_tokens, args.threads)}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
