"""Where a decode step's GPU time goes on the 27B-class model: the driver's greedy and MTP decode,
every CUDA kernel of the process recorded by CUPTI (torch.profiler; nsys is not on the device), summed
by kernel name and grouped into families (our int4 matmul, ORT's linear attention, attention, norms,
...). Run on the device after the ORT setup chunk, with ORT_MTP_LIBRARY set:

    python3 bench/kernel_profile_27b.py [--folder /tmp/models_qwen35_27b] [--new-tokens 48]

The forwards run eagerly (no CUDA graphs) so that every kernel is its own record; the GPU time of a
kernel does not depend on how it was launched. The wall time per token under CUDA graphs is what
bench/e2e_27b.py reports. Writes $OUT/kernel_profile_27b.json (else bench/results/...) and prints the
families and the top kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# Kernel-name patterns -> family, first match wins.
FAMILIES = [
    ("int4 matmul (ours)", r"Gemv(Stream|Tiles|Generic)Kernel"),
    ("int4 matmul (ORT)", r"MatMulNBits|matmul_nbits|Dequantize|fpA_intB|gemv"),
    ("state copies (ours)", r"CopySlots"),
    ("gated delta net (ours)", r"GdnKernel|ort_mtp::.*FinishKernel"),
    ("linear attention", r"[Ll]inear[Aa]ttention|delta|Delta|gated_delta|chunk"),
    ("gated attention mixer (ours)", r"ort_mtp::.*(PrepareKernel|GateKernel)"),
    ("attention (ours)", r"ort_mtp::.*(AttendKernel|CombineKernel|FillKernel|PrefillKernel)"),
    ("causal conv", r"[Cc]onv"),
    ("attention", r"[Aa]ttention|flash|Flash|fmha|mha|GQA|rotary|Rotary"),
    ("norms", r"[Nn]orm"),
    ("gemm (cuBLAS/cutlass)", r"gemm|Gemm|sm90_xmma|cutlass|cublas"),
    ("elementwise / other", r"."),
]


def family(name: str) -> str:
    for fam, pattern in FAMILIES:
        if re.search(pattern, name):
            return fam
    return "elementwise / other"


def kernel_times(prof) -> dict:
    """{kernel name: [GPU microseconds, calls]} over a torch.profiler run's CUDA events."""
    kernels = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        us = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
        kernels[ev.name][0] += us
        kernels[ev.name][1] += 1
    return kernels


def profile(gen, prompt: list[int], new_tokens: int, mode: str, k: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile

    gen.generate(prompt, 16, mode=mode, draft_tokens=k, stop_at_eos=False)  # warm-up
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        result = gen.generate(prompt, new_tokens, mode=mode, draft_tokens=k, stop_at_eos=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = kernel_times(prof)
    total = sum(v[0] for v in kernels.values())
    fams = defaultdict(float)
    for name, (us, _) in kernels.items():
        fams[family(name)] += us
    n = len(result.tokens)
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]
    return {
        "mode": mode, "draft_tokens": k if mode == "mtp" else 0, "new_tokens": n,
        "wall_ms_per_token_eager": 1e3 * wall / n,
        "gpu_kernel_ms_per_token": total / 1e3 / n,
        "kernels_per_token": sum(v[1] for v in kernels.values()) / n,
        "families_ms_per_token": {f: us / 1e3 / n for f, us in sorted(fams.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": name[:160], "ms_per_token": us / 1e3 / n, "calls": calls}
                        for name, (us, calls) in top],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp/models_qwen35_27b")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rewrite", default="all",
                    help="the driver's rewrites: all (default), or a comma list of ops.rewrite.REWRITES "
                         "(matmul: ORT's own linear-attention nodes)")
    ap.add_argument("--json", default="kernel_profile_27b.json", help="file name under $OUT")
    args = ap.parse_args(argv)

    import numpy as np
    from e2e_27b import ensure_folder
    from driver.generator import Generator

    folder = Path(args.folder)
    ensure_folder(folder, 5)
    prompt = [int(t) for t in np.random.default_rng(7).integers(100, 20000, size=64)]
    runs = []
    rewrite = True if args.rewrite == "all" else tuple(args.rewrite.split(","))
    gen = Generator(folder, provider="cuda", mode="mtp", draft_tokens=3, cuda_graphs=False, rewrite=rewrite)
    for mode, k in (("greedy", 3), ("mtp", 3)):  # k is ignored in greedy mode (it must be 1..8)
        runs.append(profile(gen, prompt, args.new_tokens, mode, k))
    out_dir = Path(os.environ.get("OUT", ROOT / "bench" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / args.json).write_text(json.dumps({"folder": str(folder), "rewrite": args.rewrite, "runs": runs}, indent=1))
    for r in runs:
        print(f"\n{r['mode']} (k={r['draft_tokens']}), {r['new_tokens']} tokens: GPU kernels "
              f"{r['gpu_kernel_ms_per_token']:.2f} ms/token ({r['kernels_per_token']:.0f} kernels), eager wall {r['wall_ms_per_token_eager']:.2f} ms/token")
        for fam, ms in r["families_ms_per_token"].items():
            print(f"  {fam:24s} {ms:7.3f} ms/token  {100 * ms / r['gpu_kernel_ms_per_token']:5.1f}%")
        for kern in r["top_kernels"][:12]:
            print(f"    {kern['ms_per_token']:7.3f} ms  {kern['calls']:6d}x  {kern['name'][:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
