"""Where a wider forward's extra GPU time goes on the 27B-class model: the main model's forward of width
1 and of width 4 (a k=3 verify), each run --reps times eagerly (no CUDA graphs, so every kernel is its own
record) under torch.profiler, GPU time per forward summed by kernel family (bench/kernel_profile_27b.py's
families). With programmatic dependent launch a kernel's record starts when its blocks start, before the
previous kernel ends, so the families overlap and do not add up to a forward's wall time; the difference
between the widths, family by family, is the point.

    python3 bench/results/2026-12-05-window-slots/width_profile.py --model /tmp/m27w0 --out $R/width_profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from kernel_profile_27b import family, kernel_times

from driver import Generator


def profile_width(gen: Generator, width: int, reps: int, rng) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    main, vocab = gen.main, gen.folder.vocab_size
    for _ in range(3):  # warm-up
        main.ids[0, :width] = gen.device.xp.asarray(rng.integers(0, vocab, width), dtype=np.int64)
        main.forward(width)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            main.ids[0, :width] = gen.device.xp.asarray(rng.integers(0, vocab, width), dtype=np.int64)
            main.forward(width)
        torch.cuda.synchronize()
    kernels = kernel_times(prof)
    families = defaultdict(float)
    for name, (us, _) in kernels.items():
        families[family(name)] += us / 1e3 / reps
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:15]
    return {"width": width, "reps": reps, "kernels_per_forward": sum(v[1] for v in kernels.values()) / reps,
            "gpu_ms_per_forward": sum(v[0] for v in kernels.values()) / 1e3 / reps,
            "families_ms": dict(sorted(families.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": n[:140], "ms_per_forward": us / 1e3 / reps, "calls": c} for n, (us, c) in top]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    gen = Generator(args.model, provider="cuda", mode="mtp", draft_tokens=3, cuda_graphs=False)
    rng = np.random.default_rng(0)
    gen.generate(rng.integers(0, gen.folder.vocab_size, 64).tolist(), 8, stop_at_eos=False)
    runs = [profile_width(gen, w, args.reps, rng) for w in (1, 4)]
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "model": str(args.model),
                                    "state_window": gen.main.spec.state_window, "runs": runs}, indent=1) + "\n")
    one, four = runs
    print(f"GPU kernel ms per forward: width 1 {one['gpu_ms_per_forward']:.3f}, width 4 {four['gpu_ms_per_forward']:.3f}")
    for fam in four["families_ms"]:
        a, b = one["families_ms"].get(fam, 0.0), four["families_ms"][fam]
        print(f"  {fam:30s} {a:7.3f} {b:7.3f}  +{b - a:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
