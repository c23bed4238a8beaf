"""Loading an MTP Generator on the CPU with two builds of the library, each in its own process,
alternating: seconds to create it (both sessions, the int8 kernel's grouped weight copies included),
the process's peak resident memory, its AnonHugePages after loading, and whether the first tokens agree.

    python bench/results/2026-12-05-pack-once/load_probe.py --model /tmp/small --library before=A.so \
        --library after=B.so --rounds 3 --out load.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def child(model: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from driver import Generator

    start = time.perf_counter()
    gen = Generator(model, provider="cpu", mode="mtp", draft_tokens=3, threads=2)
    load_s = time.perf_counter() - start
    with open("/proc/self/smaps_rollup") as f:
        huge_kb = int(next(line for line in f if "AnonHuge" in line).split()[1])
    tokens = gen.generate(list(range(1, 17)), 8, stop_at_eos=False).tokens
    return {"load_s": load_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "anon_huge_pages_mb": huge_kb / 1024, "tokens": list(tokens)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--library", action="append", default=[], help="NAME=PATH, two or more")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model)))
        return 0
    libraries = dict(item.split("=", 1) for item in args.library)
    runs = {name: [] for name in libraries}
    for r in range(args.rounds):
        for name, path in (libraries.items() if r % 2 == 0 else reversed(libraries.items())):
            env = dict(os.environ, ORT_MTP_LIBRARY=path)
            done = subprocess.run([sys.executable, __file__, "--model", args.model, "--child"], env=env,
                                  capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, {k: v for k, v in runs[name][-1].items() if k != "tokens"}, flush=True)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "revision": revision, "libraries": libraries, "runs": runs,
              "same_tokens": len({json.dumps(run["tokens"]) for name in runs for run in runs[name]}) == 1}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
