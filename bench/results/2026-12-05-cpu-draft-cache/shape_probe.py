"""The int8 CPU MatMulNBits kernel's time per million weights against the node's shape (N x K) at a
constant size, for M = 1, 2, 4, 8: 32 stacked nodes of one shape in one 2-thread session (bench/cpu.py's
session, which stops spinning when a run returns), 11 samples of 3 runs, medians.

    ORT_MTP_LIBRARY=... python bench/results/2026-12-05-cpu-draft-cache/shape_probe.py --out shape_probe.json
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cpu import layers_model, run_record, session, write_result  # noqa: E402
from ops import nbits  # noqa: E402

SHAPES = ((8192, 512), (4096, 1024), (2048, 2048), (1024, 3072), (1024, 4096), (512, 8192))
MS = (1, 2, 4, 8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    us = {}
    for N, K in SHAPES:
        rng = np.random.default_rng(0)
        layers = 32
        ws = [nbits.random_weights(rng, K, N, bits=4, block_size=32, dtype="float32") for _ in range(layers)]
        s = session(layers_model(ws, "ort_mtp", 4), 2)
        for M in MS:
            a = rng.standard_normal((M, K)).astype(np.float32)
            for _ in range(5):
                s.run(None, {"A": a})
            samples = []
            for _ in range(11):
                t = time.perf_counter()
                for _ in range(3):
                    s.run(None, {"A": a})
                samples.append((time.perf_counter() - t) / 3 / layers / (N * K / 1e6) * 1e6)
            us[f"{N}x{K} M={M}"] = round(float(np.median(samples)), 2)
        print(f"{N}x{K}: " + " ".join(f"M{M}={us[f'{N}x{K} M={M}']:.1f}" for M in MS), flush=True)
    record = run_record(us_per_million_weights=us)
    record["command"] = " ".join(["python", str(Path(__file__).resolve().relative_to(ROOT))] + sys.argv[1:])
    write_result(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
