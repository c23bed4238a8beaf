"""Where a decode step's GPU time goes on the 27B-class model: the driver's greedy and MTP decode,
every CUDA kernel of the process recorded by CUPTI (torch.profiler; nsys is not on the device), summed
by kernel name and grouped into families (our int4 matmul, ORT's linear attention, attention, norms,
...). Run on the device after the ORT setup chunk, with ORT_MTP_LIBRARY set:

    python3 bench/kernel_profile_27b.py [--folder /tmp/models_qwen35_27b] [--new-tokens 48]

The forwards run eagerly (no CUDA graphs) so that every kernel is its own record; the GPU time of a
kernel does not depend on how it was launched. The wall time per token under CUDA graphs is what
bench/e2e_27b.py reports. Writes $OUT/kernel_profile_27b.json (else bench/results/...) and prints the
families and the top kernels.

`phases` in the JSON: one more MTP generation with the driver's phase profiler on (driver.stats.Profiler:
a device synchronisation closes every phase, so a phase's kernels run inside its wall window), each
phase inside a torch.profiler user range; a kernel belongs to the range that holds its start. Per
round: each phase's wall ms (what bench/e2e_27b.py --phases reports) against the time inside it in
which the GPU ran a kernel (busy; the sum of the kernels' durations is larger where they overlap), so
that wall minus busy is what the host and the gaps between kernels cost.

    python bench/kernel_profile_27b.py --provider cpu --folder FOLDER   # a dry run of the script on the CPU EP
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
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


def device_us(ev) -> float:
    """A CUDA event's GPU microseconds (torch renamed cuda_time to device_time)."""
    return ev.device_time if hasattr(ev, "device_time") else ev.cuda_time


def kernel_times(prof) -> tuple[dict, float]:
    """{kernel name: [GPU microseconds, calls]} over a torch.profiler run's CUDA events, and the
    microseconds in which at least one of them ran (busy_us)."""
    kernels = defaultdict(lambda: [0.0, 0])
    spans = []
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        kernels[ev.name][0] += device_us(ev)
        kernels[ev.name][1] += 1
        spans.append((ev.time_range.start, device_us(ev)))
    return kernels, busy_us(spans)


def busy_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, duration) spans: the time in which at least one kernel ran.
    A sum of durations counts twice what overlaps, and kernels do overlap: under programmatic
    dependent launch (our GEMV, GatedDeltaNet's two kernels) a kernel starts before the one ahead of it
    has ended, so a phase's summed kernel time can exceed its wall time."""
    total, end = 0.0, float("-inf")
    for start, us in sorted(spans):
        stop = start + us
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def activities(provider: str) -> list:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CUDA] if provider == "cuda" else [ProfilerActivity.CPU]


def synchronize(provider: str) -> None:
    if provider == "cuda":
        import torch

        torch.cuda.synchronize()


def profile(gen, prompt: list[int], new_tokens: int, mode: str, k: int, provider: str = "cuda") -> dict:
    from torch.profiler import profile as tprofile

    gen.generate(prompt, 16, mode=mode, draft_tokens=k, stop_at_eos=False)  # warm-up
    synchronize(provider)
    with tprofile(activities=activities(provider)) as prof:
        start = time.perf_counter()
        result = gen.generate(prompt, new_tokens, mode=mode, draft_tokens=k, stop_at_eos=False)
        synchronize(provider)
        wall = time.perf_counter() - start
    kernels, busy = kernel_times(prof)
    total = sum(v[0] for v in kernels.values())
    fams = defaultdict(float)
    for name, (us, _) in kernels.items():
        fams[family(name)] += us
    n = max(len(result.tokens), 1)
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]
    return {
        "mode": mode, "draft_tokens": k if mode == "mtp" else 0, "new_tokens": n,
        "wall_ms_per_token_eager": 1e3 * wall / n,
        "gpu_kernel_ms_per_token": total / 1e3 / n,  # a sum of kernel durations (busy_us: overlaps count twice)
        "gpu_busy_ms_per_token": busy / 1e3 / n,
        "kernels_per_token": sum(v[1] for v in kernels.values()) / n,
        "families_ms_per_token": {f: us / 1e3 / n for f, us in sorted(fams.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": name[:160], "ms_per_token": us / 1e3 / n, "calls": calls}
                        for name, (us, calls) in top],
    }


PHASE_RANGE = "phase:"  # torch.profiler user ranges opened around the driver's phases


@contextmanager
def phases_as_ranges():
    """driver.stats.Profiler.phase, each phase also inside a torch.profiler user range named
    PHASE_RANGE + phase (the range encloses the phase's closing synchronisation)."""
    from torch.profiler import record_function

    from driver import stats

    original = stats.Profiler.phase

    @contextmanager
    def phase(self, name):
        with record_function(PHASE_RANGE + name), original(self, name):
            yield

    stats.Profiler.phase = phase
    try:
        yield
    finally:
        stats.Profiler.phase = original


def assign_to_ranges(ranges: list[tuple[str, float, float]], kernels: list[tuple[str, float, float]]) -> tuple[dict, dict]:
    """({range name: {kernel name: [us, calls]}}, {range name: busy us}): each kernel (name, start,
    duration) in the range (name, start, end) that holds its start, or in "outside phases"; busy_us
    of each range's kernels."""
    ranges = sorted(ranges, key=lambda r: r[1])
    starts = [r[1] for r in ranges]
    out: dict = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    spans = defaultdict(list)
    for name, start, us in kernels:
        i = bisect.bisect_right(starts, start) - 1
        where = ranges[i][0] if i >= 0 and start <= ranges[i][2] else "outside phases"
        out[where][name][0] += us
        out[where][name][1] += 1
        spans[where].append((start, us))
    return out, {where: busy_us(s) for where, s in spans.items()}


def phase_profile(gen, prompt: list[int], new_tokens: int, k: int, provider: str) -> dict:
    """GPU kernel time inside each phase of the MTP round (the module docstring's `phases`)."""
    from torch.profiler import ProfilerActivity, profile as tprofile

    gen.generate(prompt, 16, mode="mtp", draft_tokens=k, stop_at_eos=False)  # warm-up
    profiling = gen.profile
    gen.profile = True
    try:
        # CPU activity too: the user ranges are CPU events (on CUDA, kineto also mirrors them on the GPU
        # timeline, as device events under the same names, which are not kernels)
        with phases_as_ranges(), tprofile(activities=sorted({ProfilerActivity.CPU, *activities(provider)}, key=str)) as prof:
            result = gen.generate(prompt, new_tokens, mode="mtp", draft_tokens=k, stop_at_eos=False)
            synchronize(provider)
    finally:
        gen.profile = profiling
    ranges, kernels = [], []
    for ev in prof.events():
        on_device = ev.device_type.name == "CUDA"
        if ev.name.startswith(PHASE_RANGE):
            if not on_device:
                ranges.append((ev.name[len(PHASE_RANGE):], ev.time_range.start, ev.time_range.end))
        elif on_device:
            kernels.append((ev.name, ev.time_range.start, device_us(ev)))
    by_phase, busy = assign_to_ranges(ranges, kernels)
    stats = result.stats.as_dict()
    rounds = max(result.stats.rounds, 1)
    phases = {}
    measured = {r[0] for r in ranges}  # "host overhead" and "round" are derived by the driver, not ranges
    for name, wall in (stats.get("phase_ms_per_round") or {}).items():
        if name not in measured:
            phases[name] = {"wall_ms_per_round": wall}
            continue
        own = by_phase.get(name, {})
        top = sorted(own.items(), key=lambda kv: -kv[1][0])[:8]
        phases[name] = {
            "wall_ms_per_round": wall,
            "kernel_ms_per_round": round(sum(v[0] for v in own.values()) / 1e3 / rounds, 4),
            "busy_ms_per_round": round(busy.get(name, 0.0) / 1e3 / rounds, 4),
            "kernels_per_round": round(sum(v[1] for v in own.values()) / rounds, 2),
            "top_kernels": [{"name": n[:160], "ms_per_round": round(us / 1e3 / rounds, 4), "calls": c}
                            for n, (us, c) in top],
        }
    outside = by_phase.get("outside phases", {})
    return {"draft_tokens": k, "rounds": result.stats.rounds, "acceptance": stats.get("acceptance"),
            "phase_ranges": len(ranges), "phases": phases,
            "kernel_ms_per_round_outside_phases": round(sum(v[0] for v in outside.values()) / 1e3 / rounds, 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp/models_qwen35_27b")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rewrite", default="all",
                    help="the driver's rewrites: all (default), or a comma list of ops.rewrite.REWRITES "
                         "(matmul: ORT's own linear-attention nodes)")
    ap.add_argument("--json", default="kernel_profile_27b.json", help="file name under $OUT")
    ap.add_argument("--provider", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of the script on a CPU folder (no kernels to record)")
    args = ap.parse_args(argv)

    import numpy as np
    from e2e_27b import ensure_folder
    from driver.generator import Generator

    folder = Path(args.folder)
    if args.provider == "cuda":
        ensure_folder(folder, 5)
    rewrite = True if args.rewrite == "all" else tuple(args.rewrite.split(","))
    gen = Generator(folder, provider=args.provider, mode="mtp", draft_tokens=3, cuda_graphs=False, rewrite=rewrite)
    prompt = [int(t) for t in np.random.default_rng(7).integers(100, min(20000, gen.folder.vocab_size), size=64)]
    runs = []
    for mode, k in (("greedy", 3), ("mtp", 3)):  # k is ignored in greedy mode (it must be 1..8)
        runs.append(profile(gen, prompt, args.new_tokens, mode, k, args.provider))
    phases = phase_profile(gen, prompt, args.new_tokens, 3, args.provider)
    out_dir = Path(os.environ.get("OUT", ROOT / "bench" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / args.json).write_text(json.dumps({"folder": str(folder), "provider": args.provider, "rewrite": args.rewrite,
                                                 "runs": runs, "phases": phases}, indent=1))
    for r in runs:
        print(f"\n{r['mode']} (k={r['draft_tokens']}), {r['new_tokens']} tokens: GPU kernels "
              f"{r['gpu_kernel_ms_per_token']:.2f} ms/token ({r['kernels_per_token']:.0f} kernels; busy "
              f"{r['gpu_busy_ms_per_token']:.2f}), eager wall {r['wall_ms_per_token_eager']:.2f} ms/token")
        for fam, ms in r["families_ms_per_token"].items():
            print(f"  {fam:24s} {ms:7.3f} ms/token  {100 * ms / r['gpu_kernel_ms_per_token']:5.1f}%")
        for kern in r["top_kernels"][:12]:
            print(f"    {kern['ms_per_token']:7.3f} ms  {kern['calls']:6d}x  {kern['name'][:110]}")
    print(f"\nMTP k={phases['draft_tokens']} round by phase ({phases['rounds']} rounds, acceptance "
          f"{phases['acceptance']}), ms per round: wall (phases synchronised) / GPU busy inside / "
          f"kernel durations summed")
    for name, ph in phases["phases"].items():
        inside = (f" / {ph['busy_ms_per_round']:7.3f} / {ph['kernel_ms_per_round']:7.3f}  "
                  f"({ph['kernels_per_round']:.0f} kernels)" if "kernel_ms_per_round" in ph else "")
        print(f"  {name:14s} {ph['wall_ms_per_round']:7.3f}{inside}")
    print(f"  kernels outside phases {phases['kernel_ms_per_round_outside_phases']:.3f} ms per round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
