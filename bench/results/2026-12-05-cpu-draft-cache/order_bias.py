"""An A/A check of paired.py's method: two Generators of the same folder in one process, each on its own
copy of the SAME library file (so each has its own weight copies, as two builds do), the main model's
forward of width 1 and 4 timed alternately (the order inside each repetition flips every time).

    python bench/results/2026-12-05-cpu-draft-cache/order_bias.py --model /tmp/small --library <CPU build .so> --reps 100
"""
import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import ops  # noqa: E402
from driver import Generator  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--library", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", type=Path, help="JSON of the medians, with the command")
    args = ap.parse_args()
    copy_dir = Path(tempfile.mkdtemp(prefix="order-bias-"))
    copy = copy_dir / args.library.name
    shutil.copy(args.library, copy)
    gens = {}
    for name, lib in (("created first", str(args.library)), ("created second", str(copy))):
        ops.library_path = lambda lib=lib: lib  # what driver.sessions registers
        gens[name] = Generator(args.model, provider="cpu", mode="mtp", draft_tokens=3, threads=2)
    rng = np.random.default_rng(0)
    vocab = next(iter(gens.values())).folder.vocab_size
    for g in gens.values():
        g.generate(rng.integers(0, vocab, 32).tolist(), 8, stop_at_eos=False)
    times = {n: {w: [] for w in (1, 4)} for n in gens}
    for rep in range(args.reps):
        for w in (4, 1):
            order = list(gens.items()) if rep % 2 == 0 else list(gens.items())[::-1]
            for name, g in order:
                g.main.ids[0, :w] = rng.integers(0, vocab, w)
                start = time.perf_counter()
                g.main.forward(w)
                times[name][w].append(time.perf_counter() - start)
    medians = {n: {w: round(1e3 * float(np.median(v[w][10:])), 4) for w in (1, 4)} for n, v in times.items()}
    for w in (1, 4):
        print(f"width {w}: " + ", ".join(f"{n} {m[w]:.3f} ms" for n, m in medians.items()))
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                        "reps": args.reps, "median_ms": medians}, indent=1) + "\n")
    shutil.rmtree(copy_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
