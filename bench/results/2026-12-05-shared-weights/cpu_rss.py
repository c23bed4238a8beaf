"""driver.shared_weights on the CPU: what an MTP Generator's resident memory, load time and speed are with
the head's shared tensors copied once for both sessions ("on", forced) and left to ONNX Runtime ("off",
the CPU's default since this measurement), one process per variant, alternating:

    python bench/results/2026-12-05-shared-weights/cpu_rss.py FOLDER [--rounds 2] [--json OUT.json]

Each process creates an MTP Generator (k = 3), runs a short warm-up, reads the resident memory it added
(/proc/self/statm), and decodes 3 prompts x 64 new tokens (median tok/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

from cpu import run_record, write_result  # noqa: E402  (bench/cpu.py: a result's opening, its file)


def one(folder: str, variant: str) -> dict:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import numpy as np
    from e2e_27b import memory_used

    from driver import Generator
    from driver.device import CpuDevice

    CpuDevice.shares_weights = variant == "on"
    before = memory_used("cpu")
    start = time.perf_counter()
    gen = Generator(folder, provider="cpu", mode="mtp", draft_tokens=3)
    load = time.perf_counter() - start
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 8000, 32).tolist() for _ in range(3)]
    gen.generate(prompts[0], 8, stop_at_eos=False)
    after = memory_used("cpu")
    speeds = [gen.generate(p, 64, stop_at_eos=False).stats.tokens_per_second for p in prompts]
    return {"variant": variant, "load_s": round(load, 3), "rss_added_bytes": after - before,
            "tok_s_median": round(statistics.median(speeds), 2),
            "reused_bytes": gen.shared_weights.reused_bytes if gen.shared_weights is not None else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # one measurement, in a child process
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(one(args.folder, args.variant)))
        return 0
    rows = []
    for _ in range(args.rounds):
        for variant in ("on", "off"):
            out = subprocess.run([sys.executable, __file__, args.folder, "--variant", variant], check=True,
                                 capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{variant:3s}: load {r['load_s']:.2f} s, resident memory added {r['rss_added_bytes'] / 1e6:.0f} MB, "
                  f"MTP k=3 {r['tok_s_median']:.1f} tok/s, shared {r['reused_bytes'] / 1e6:.0f} MB", flush=True)
    # the command as run from the repository root; run_record's own names bench/<script>
    command = " ".join(["python", str(Path(__file__).resolve().relative_to(ROOT)), *sys.argv[1:]])
    write_result(run_record(command=command, rows=rows), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
