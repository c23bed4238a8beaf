"""Two builds of the library compared in separate processes, alternating (in one process the Generator
created first runs slower: bench/results/2026-12-05-cpu-draft-cache/order_bias.py). Each child process: one
MTP Generator (k=3), the main forward of width 1 and 4 timed 60 times each (medians), then greedy and MTP
k=3 decoding of 3 prompts x 64 new tokens, 3 times each (median tok/s, each mode its own Generator), and
the process's AnonHugePages.

    python bench/results/2026-12-05-huge-pages/ab.py --model /tmp/small --library before=A.so --library after=B.so \
        --rounds 3 --out ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def child(model: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from driver import Generator

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 32768, 32).tolist() for _ in range(3)]
    out = {}
    for mode in ("mtp", "greedy"):
        gen = Generator(model, provider="cpu", mode=mode, draft_tokens=3, threads=2)
        gen.generate(prompts[0], 16, stop_at_eos=False)
        if mode == "mtp":
            times = {1: [], 4: []}
            for _ in range(60):
                for w in (1, 4):
                    gen.main.ids[0, :w] = rng.integers(0, gen.folder.vocab_size, w)
                    start = time.perf_counter()
                    gen.main.forward(w)
                    times[w].append(time.perf_counter() - start)
            out.update({f"forward_{w}_ms": 1e3 * float(np.median(v[5:])) for w, v in times.items()})
            with open("/proc/self/smaps_rollup") as f:
                out["anon_huge_pages_kb"] = int(next(line for line in f if "AnonHuge" in line).split()[1])
        runs = [gen.generate(p, 64, stop_at_eos=False).stats.as_dict()["tokens_per_second"] for p in prompts for _ in range(3)]
        out[f"{mode}_tok_s"] = float(np.median(runs))
        del gen
    return out


def main(measure=child, script: str = __file__, doc: str = __doc__) -> int:
    """Runs `script --child` (which calls `measure(model)`) once per library and round, in that order;
    bench/results/2026-12-05-pack-once/load_probe.py reuses it with its own measure."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--library", action="append", default=[], help="NAME=PATH, two or more")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.model)))
        return 0
    libraries = dict(item.split("=", 1) for item in args.library)
    runs = []
    for round_ in range(args.rounds):
        for name, path in libraries.items():
            env = dict(os.environ, ORT_MTP_LIBRARY=path)
            done = subprocess.run([sys.executable, script, "--child", "--model", args.model], env=env,
                                  capture_output=True, text=True, check=True)
            row = {"round": round_, "library": name, **json.loads(done.stdout.strip().splitlines()[-1])}
            runs.append(row)
            print(json.dumps(row), flush=True)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "revision": revision, "libraries": libraries, "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
