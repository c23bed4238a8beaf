"""What the state window's extra slots cost a verify: the main model's forward of width w timed with
the window MTP adds in memory (k+1 slots: a width-(k+1) verify writes the state after each of its
tokens) and without it (--commit replay: one slot, the state after the last token), same folder, same
process, interleaved.

    python bench/results/2026-12-05-window-slots/slots_probe.py --model /tmp/small --provider cpu --threads 2 --out cpu.json
    python3 bench/results/2026-12-05-window-slots/slots_probe.py --model /tmp/models_qwen35_27b --provider cuda --out cuda.json

The difference at w = k+1 bounds what a commit that does not need every token's state written (e.g.
one that replays the accepted tokens' rank-1 updates from the previous state) could save per round.
A folder exported with a window (state_window > 0) has it in both Generators: use one without.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from driver import Generator


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--provider", default="cpu")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    k = args.draft_tokens
    common = {"provider": args.provider, "mode": "mtp", "draft_tokens": k, "threads": args.threads}
    gens = {"window": Generator(args.model, **common), "no_window": Generator(args.model, commit="replay", **common)}
    windows = {name: g.main.spec.state_window for name, g in gens.items()}
    if windows["no_window"]:
        raise SystemExit(f"{args.model} was exported with a state window ({windows['no_window']}): use a folder without")
    rng = np.random.default_rng(0)
    vocab = gens["window"].folder.vocab_size
    prompt = rng.integers(0, vocab, 32).tolist()
    same = len({tuple(g.generate(prompt, 24, stop_at_eos=False).tokens) for g in gens.values()}) == 1
    widths = list(range(1, k + 3))
    times = {name: {w: [] for w in widths} for name in gens}
    for _ in range(args.reps):
        for w in widths:
            for name, g in gens.items():
                g.main.ids[0, :w] = g.device.xp.asarray(rng.integers(0, vocab, w), dtype=np.int64)
                g.device.synchronize()
                start = time.perf_counter()
                g.main.forward(w)
                g.device.synchronize()
                times[name][w].append(time.perf_counter() - start)
    skip = max(2, args.reps // 10)  # the first calls of a width capture its CUDA graph
    median = {name: {w: round(1e3 * float(np.median(v[skip:])), 4) for w, v in per.items()} for name, per in times.items()}
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "revision": revision, "provider": args.provider, "threads": args.threads, "draft_tokens": k,
              "state_windows": windows, "same_tokens": same, "reps": args.reps, "median_ms": median,
              "window_minus_no_window_ms": {w: round(median["window"][w] - median["no_window"][w], 4) for w in widths}}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({key: result[key] for key in ("state_windows", "same_tokens", "median_ms", "window_minus_no_window_ms")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
