"""What an MTP round's parts cost against a greedy step on the CPU, in one process: the main graph's
forward at width 1 on a greedy Generator (a greedy step), at width k+1 on an MTP Generator for k drafts
(its verify: the state window of k+1 slots added in memory), and one head forward of width 1 (a
chained draft), each timed in turn, interleaved over --reps turns, medians in ms.

    python bench/results/2026-12-05-cpu-verify-width/probe.py --model /tmp/small --reps 20 --out probe.json
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cpu import run_record, write_result  # noqa: E402
from driver import Generator  # noqa: E402

PROMPT = "def read_config(path):\n    with open(path) as f:\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    gens = {"greedy": Generator(args.model, mode="greedy", threads=args.threads)}
    for k in (1, 2, 3, 4):
        gens[f"mtp_k{k}"] = Generator(args.model, mode="mtp", draft_tokens=k, threads=args.threads)
    for g in gens.values():
        g.generate(PROMPT, 16, mode="greedy")
    timed = {"greedy step (width 1)": lambda: gens["greedy"].main.forward(1),
             "head forward (width 1)": lambda: gens["mtp_k1"].head.forward(1)}
    for k in (1, 2, 3, 4):
        timed[f"verify k={k} (width {k + 1}, window {gens[f'mtp_k{k}'].main.spec.state_window})"] = (
            lambda k=k: gens[f"mtp_k{k}"].main.forward(k + 1))
    for k in (1, 3):
        timed[f"greedy Generator at width {k + 1} (no window)"] = lambda k=k: gens["greedy"].main.forward(k + 1)
    times = {name: [] for name in timed}
    names = list(timed)
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            fn = timed[name]
            fn(), fn()
            t = time.perf_counter()
            for _ in range(10):
                fn()
            times[name].append((time.perf_counter() - t) / 10 * 1e3)
    ms = {name: round(statistics.median(v), 3) for name, v in times.items()}
    for name, v in ms.items():
        print(f"{name:50s} {v:7.3f} ms", flush=True)
    record = run_record(model=args.model, reps=args.reps, threads=args.threads, forward_ms=ms)
    record["command"] = " ".join(["python", str(Path(__file__).resolve().relative_to(ROOT))] + sys.argv[1:])
    write_result(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
