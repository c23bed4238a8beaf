"""A draft right after a verify, and the one after it, on an MTP Generator (k=1) of the CPU: per
repetition, the main graph's forward at width 2 (a verify), then two head forwards of width 1, each
timed; medians in ms. One process per library (ORT_MTP_LIBRARY), so run it once per build.

    ORT_MTP_LIBRARY=... python bench/results/2026-12-05-cpu-draft-cache/draft_probe.py --model /tmp/small --reps 200
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from driver import Generator  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    g = Generator(args.model, mode="mtp", draft_tokens=1, threads=2)
    g.generate("def read_config(path):\n", 16, mode="greedy")
    verify, first, second = [], [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        g.main.forward(2)
        t1 = time.perf_counter()
        g.head.forward(1)
        t2 = time.perf_counter()
        g.head.forward(1)
        t3 = time.perf_counter()
        verify.append(t1 - t0), first.append(t2 - t1), second.append(t3 - t2)
    ms = lambda v: round(statistics.median(v) * 1e3, 3)  # noqa: E731
    print(json.dumps({"library": os.environ.get("ORT_MTP_LIBRARY"), "verify_width2_ms": ms(verify),
                      "draft_after_verify_ms": ms(first), "second_draft_ms": ms(second)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
