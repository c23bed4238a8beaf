"""ort_mtp::GatedDeltaNet on the CPU EP against ONNX Runtime's own com.microsoft subgraph
(ops.gated_delta_net.ort_subgraph_model), one `small`-preset linear-attention layer (Hk=8, Hv=16,
dk=dv=64, K=4, float32, batch 1), at widths S = 1, 2, 4 and a 32-token prefill chunk.

    ORT_MTP_LIBRARY=... python bench/gated_delta_net_cpu.py [--threads 2] [--reps 200] [--out FILE]

Each session.run is timed on the host (perf_counter) after 20 warm-up runs; the min and the median of
--reps runs, in us. The two implementations alternate per width, so a noisy machine's slow spells fall
on both. Writes JSON to --out (else prints it only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ops.gated_delta_net as gdn  # noqa: E402
from cpu import git_revision, session  # noqa: E402  (bench/cpu.py: a CPU session with the library registered)

WIDTHS = (1, 2, 4, 32)


def timed(s: ort.InferenceSession, feeds: dict, reps: int) -> dict:
    for _ in range(20):
        s.run(None, feeds)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        s.run(None, feeds)
        times.append(time.perf_counter() - t)
    return {"min_us": round(min(times) * 1e6, 1), "median_us": round(float(np.median(times)) * 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    cfg = gdn.GdnConfig(num_k_heads=8, num_v_heads=16, k_head_dim=64, v_head_dim=64, dtype="float32")
    weights = gdn.random_weights(np.random.default_rng(0), cfg)
    sessions = {"ours": session(gdn.gated_delta_net_model(cfg, weights), args.threads),
                "ort_subgraph": session(gdn.ort_subgraph_model(cfg, weights), args.threads)}
    names = {name: {i.name for i in s.get_inputs()} for name, s in sessions.items()}
    rows = []
    for seq in WIDTHS:
        inputs = gdn.random_inputs(np.random.default_rng(seq), cfg, 1, seq)
        feeds = gdn.feeds(inputs, cfg, None)
        row = {"S": seq}
        for name, s in sessions.items():
            row[name] = timed(s, {k: v for k, v in feeds.items() if k in names[name]}, args.reps)
        rows.append(row)
        print(f"S={seq:3d}: ours min {row['ours']['min_us']:8.1f} median {row['ours']['median_us']:8.1f} us   "
              f"ORT's subgraph min {row['ort_subgraph']['min_us']:8.1f} median {row['ort_subgraph']['median_us']:8.1f} us",
              flush=True)
    result = {"command": "python bench/gated_delta_net_cpu.py " + " ".join(sys.argv[1:]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "revision": git_revision(),
              "library": os.environ.get("ORT_MTP_LIBRARY", "installed"), "onnxruntime": ort.__version__,
              "threads": args.threads, "shape": {"hk": 8, "hv": 16, "dk": 64, "dv": 64, "kernel": 4, "dtype": "float32"},
              "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
