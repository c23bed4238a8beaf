"""Interleaved A/B of ONNX Runtime's CUDA arena growing by request (arena_extend_strategy=kSameAsRequested)
against its default (each extension doubling), on the 27B-class folder, in one process:

    OUT=DIR python bench/results/2026-12-05-shared-weights/arena_ab.py [--folder F] [--prompts 4]
        [--new-tokens 128] [--repetitions 2] [--modes greedy,mtp_k3,mtp_k4] [--provider cuda]

Two MTP Generators, one per arena setting (the setting is a session option: it cannot change on one
Generator), each's device memory measured as it is created; then for each repetition, mode and prompt
both run back to back (the order alternating between repetitions). Per (mode, variant): the median over
prompts of each prompt's median decode tok/s, the median prefill seconds, and whether the two variants
printed the same tokens. --provider cpu with a small folder is a dry run of the script (the CPU EP has
no such arena option: both variants are then the same).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from e2e_27b import ensure_folder, git_revision, memory_used  # noqa: E402
from gpu_timing import out_dir  # noqa: E402  ($OUT, else bench/results)

import driver.device  # noqa: E402
from driver import Generator  # noqa: E402

VARIANTS = ("default", "same")


def make(folder: Path, provider: str, variant: str) -> Generator:
    """An MTP Generator whose CUDA sessions get `variant`'s arena setting."""
    plain = driver.device.CudaDevice.providers

    def providers(self, graph_capture=False):
        out = plain(self, graph_capture)
        if variant == "same":
            out[0][1]["arena_extend_strategy"] = "kSameAsRequested"
        return out

    driver.device.CudaDevice.providers = providers
    try:
        return Generator(folder, provider=provider, mode="mtp", draft_tokens=4)
    finally:
        driver.device.CudaDevice.providers = plain


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp/models_qwen35_27b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--modes", default="greedy,mtp_k3,mtp_k4")
    ap.add_argument("--provider", default="cuda")
    args = ap.parse_args()
    folder = Path(args.folder)
    report = {"command": " ".join(["bench/results/2026-12-05-shared-weights/arena_ab.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "revision": git_revision(),
              "build": ensure_folder(folder, 5, None), "memory_bytes": {}}
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    rng = np.random.default_rng(0)  # bench/e2e_27b.py's prompts
    prompts = [rng.integers(0, min(vocab, 8000), 64).tolist() for _ in range(args.prompts)]
    gens = {}
    for variant in VARIANTS:
        before = memory_used(args.provider, release=True)
        gens[variant] = make(folder, args.provider, variant)
        gens[variant].generate(prompts[0], 8, mode="greedy", stop_at_eos=False)  # prefill and width-1 graphs
        after = memory_used(args.provider)
        report["memory_bytes"][variant] = None if before is None or after is None else after - before
    modes = args.modes.split(",")

    def run(mode, variant, p):
        k = int(mode[len("mtp_k"):]) if mode.startswith("mtp_k") else None
        return gens[variant].generate(prompts[p], args.new_tokens, mode="mtp" if k else "greedy",
                                      draft_tokens=k, stop_at_eos=False)

    for mode in modes:  # warm-up: every width's CUDA graphs
        for variant in VARIANTS:
            run(mode, variant, 0)
    runs = {(m, v, p): [] for m in modes for v in VARIANTS for p in range(len(prompts))}
    for rep in range(args.repetitions):
        order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
        for mode in modes:
            for p in range(len(prompts)):
                for variant in order:
                    runs[(mode, variant, p)].append(run(mode, variant, p))
    rows = {}
    for mode in modes:
        for variant in VARIANTS:
            results = [runs[(mode, variant, p)] for p in range(len(prompts))]
            rows[f"{mode}_{variant}"] = {
                "tok_s_median": statistics.median(statistics.median(r.stats.tokens_per_second for r in rs)
                                                  for rs in results),
                "tok_s_runs": [[round(r.stats.tokens_per_second, 2) for r in rs] for rs in results],
                "prefill_s_median": statistics.median(r.stats.prefill_seconds for rs in results for r in rs),
            }
        same = sum(all(a.tokens == b.tokens for a, b in zip(runs[(mode, "default", p)], runs[(mode, "same", p)]))
                   for p in range(len(prompts)))
        a, b = rows[f"{mode}_same"], rows[f"{mode}_default"]
        a["identical_to_default"] = same
        print(f"{mode:8s} same {a['tok_s_median']:7.1f}  default {b['tok_s_median']:7.1f}  "
              f"({100 * (a['tok_s_median'] / b['tok_s_median'] - 1):+.1f}%)  prefill {a['prefill_s_median'] * 1e3:.1f} / "
              f"{b['prefill_s_median'] * 1e3:.1f} ms  same tokens {same} of {len(prompts)}", flush=True)
    memory = report["memory_bytes"]
    print("memory added: " + ", ".join(f"{v} {memory[v] / 1e9:.2f} GB" for v in VARIANTS if memory[v] is not None))
    report["modes"] = rows
    (out_dir(None) / "arena_ab.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
