"""Prefill time on the CPU EP, ours against the driver on ONNX Runtime's own ops, at several prompt lengths:

    python bench/results/2026-12-05-long-prompt/ttft_cpu.py FOLDER [--lengths 64,512,2048] [--json OUT]

A greedy Generator per variant (our rewrite; `rewrite=False`), random prompts of each length, one warm-up,
then the fastest of two prefills (Stats.prefill_seconds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cpu import run_record, write_result  # noqa: E402  (bench/cpu.py: a result's opening, its file)

from driver import Generator  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--lengths", default="64,512,2048")
    ap.add_argument("--json")
    args = ap.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    rng = np.random.default_rng(0)
    prompts = {n: rng.integers(0, 8000, n).tolist() for n in lengths}
    rows = []
    for rewrite in (True, False):
        gen = Generator(args.folder, provider="cpu", mode="greedy", rewrite=rewrite, max_length=max(lengths) + 8)
        for n in lengths:
            gen.generate(prompts[n], 2, stop_at_eos=False)
            seconds = min(gen.generate(prompts[n], 2, stop_at_eos=False).stats.prefill_seconds for _ in range(2))
            rows.append({"ours": rewrite, "prompt_tokens": n, "prefill_ms": round(seconds * 1e3, 1)})
            print(f"{'ours' if rewrite else 'ORT ':4s} prompt {n:5d}: prefill {seconds * 1e3:7.1f} ms", flush=True)
    # the command as run from the repository root; run_record's own names bench/<script>
    command = " ".join(["python", str(Path(__file__).resolve().relative_to(ROOT)), *sys.argv[1:]])
    write_result(run_record(command=command, rows=rows), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
