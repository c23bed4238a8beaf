"""Decode tok/s of two or more builds of the library in one process, paired: a Generator per build and
mode (greedy, MTP k = 1, 2, 3; ORT_MTP_LIBRARY set while each is created), the repetitions interleaved
over all of them (alternating the order), so that the machine's slow spells fall on every build alike.
Medians, and each build's MTP against its own greedy.

    python bench/results/2026-12-05-cpu-draft-cache/paired.py --model /tmp/small \
        --library before=/tmp/a/libort_mtp_ops.so --library after=/tmp/b/libort_mtp_ops.so --reps 8 --out paired.json
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cpu import run_record, write_result  # noqa: E402
from driver import Generator  # noqa: E402

MODES = (("greedy", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--library", action="append", required=True, help="NAME=PATH (two or more)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    libraries = dict(item.split("=", 1) for item in args.library)
    prompt = list(range(5, 5 + 32))  # bench/cpu.py's prompt
    gens = {}
    for name, path in libraries.items():
        os.environ["ORT_MTP_LIBRARY"] = path  # read when a Generator's sessions are created
        for mode, k in MODES:
            gens[name, k] = Generator(args.model, provider="cpu", mode=mode, draft_tokens=max(k, 1),
                                      threads=args.threads)
    runs = {key: [] for key in gens}
    tokens, acceptance = {}, {}
    for rep in range(args.reps + 1):  # the first pass warms up
        for key in (list(gens) if rep % 2 else list(gens)[::-1]):
            r = gens[key].generate(prompt, args.new_tokens, stop_at_eos=False)
            if rep:
                runs[key].append(r.stats.new_tokens / r.stats.decode_seconds)
            tokens[key] = r.tokens
            acceptance[key] = r.stats.as_dict().get("acceptance")
    first = next(iter(libraries))
    result = {}
    for name in libraries:
        greedy = statistics.median(runs[name, 0])
        result[name] = {
            "library": libraries[name],
            "tok_s": {f"k{k}": round(statistics.median(runs[name, k]), 2) for _, k in MODES},
            "over_greedy": {f"k{k}": round(statistics.median(runs[name, k]) / greedy, 3) for _, k in MODES if k},
            "acceptance": {f"k{k}": acceptance[name, k] for _, k in MODES if k},
            "equals_greedy": all(tokens[name, k] == tokens[first, 0] for _, k in MODES),
            "tok_s_runs": {f"k{k}": [round(x, 2) for x in runs[name, k]] for _, k in MODES},
        }
        print(name, result[name]["tok_s"], result[name]["over_greedy"], "equal:", result[name]["equals_greedy"],
              flush=True)
    record = run_record(model=args.model, reps=args.reps, new_tokens=args.new_tokens, threads=args.threads,
                        builds=result)
    record["command"] = " ".join(["python", str(Path(__file__).resolve().relative_to(ROOT))] + sys.argv[1:])
    write_result(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
