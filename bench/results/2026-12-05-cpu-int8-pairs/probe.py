"""The int8 CPU MatMulNBits kernel per M on two streaming shapes and one in-cache node, with the
two-group tile on and off (ORT_MTP_CPU_PAIRS, read once per process: one process per setting, run in
turn). Sessions stop spinning when a run returns (bench/cpu.py's session).

    python bench/results/2026-12-05-cpu-int8-pairs/probe.py --rounds 2 --out probe.json
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
SHAPES = {"stream_4096x1024": (4096, 1024, 32), "stream_1024x4096": (1024, 4096, 32), "l2_1024x1024": (1024, 1024, 1)}
MS = [1, 2, 3, 4, 5, 8]


def one_process(reps: int) -> dict:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from cpu import layers_model, session
    from ops import nbits
    rng = np.random.default_rng(0)
    sessions = {}
    for name, (N, K, layers) in SHAPES.items():
        ws = [nbits.random_weights(rng, K, N, bits=4, block_size=32, dtype="float32") for _ in range(layers)]
        sessions[name] = (session(layers_model(ws, "ort_mtp", 4), 2), K, layers)
    times = {}
    for _ in range(reps):
        for name, (s, K, layers) in sessions.items():
            for M in MS:
                a = rng.standard_normal((M, K)).astype(np.float32)
                runs = 3 if layers > 1 else 200
                s.run(None, {"A": a})
                t = time.perf_counter()
                for _ in range(runs):
                    s.run(None, {"A": a})
                times.setdefault(f"{name} M={M}", []).append((time.perf_counter() - t) / runs / layers * 1e6)
    return {k: round(float(np.median(v)), 2) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_process(args.reps)))
        return 0
    out = {"command": " ".join(sys.argv), "library": os.environ.get("ORT_MTP_LIBRARY"), "us_per_node": []}
    for r in range(args.rounds):
        for pairs in ("0", "1"):
            env = dict(os.environ, ORT_MTP_CPU_PAIRS=pairs)
            res = subprocess.run([sys.executable, __file__, "--child", "--reps", str(args.reps)], env=env,
                                 check=True, capture_output=True, text=True)
            row = {"round": r, "pairs": pairs == "1", **json.loads(res.stdout.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            out["us_per_node"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
