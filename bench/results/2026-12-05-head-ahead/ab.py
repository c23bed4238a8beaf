"""Interleaved A/B of Generator.head_ahead (8530894: the next round's first head forward queued before
the accept's synchronisation) on the 27B-class folder, in one process on one Generator, so that the
two variants share sessions, CUDA graphs and the machine's drift:

    OUT=DIR python bench/results/2026-12-05-head-ahead/ab.py [--folder F] [--prompts 4] [--new-tokens 256]
        [--repetitions 3] [--temperatures 0,0.7] [--provider cuda]

For each repetition, temperature, k = 1..4 and prompt, both variants run back to back (their order
alternates between repetitions). Per (temperature, k, variant): the median over prompts of each
prompt's median decode tok/s; the acceptance; at T = 0 whether every stream equals greedy's, at T > 0
(seed = the prompt's index) whether the two variants drew the same streams. --provider cpu with a
small folder is a dry run (head_ahead forced on the CPU, where it is off by default).
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

from e2e_27b import ensure_folder, git_revision  # noqa: E402
from gpu_timing import out_dir  # noqa: E402  ($OUT, else bench/results)

from driver import Generator  # noqa: E402

KS = (1, 2, 3, 4)
VARIANTS = {"ahead": True, "plain": False}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp/models_qwen35_27b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--provider", default="cuda")
    args = ap.parse_args()
    folder = Path(args.folder)
    report = {"command": " ".join(["bench/results/2026-12-05-head-ahead/ab.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "revision": git_revision(),
              "build": ensure_folder(folder, 5, None)}
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    rng = np.random.default_rng(0)  # bench/e2e_27b.py's prompts
    prompts = [rng.integers(0, min(vocab, 8000), 64).tolist() for _ in range(args.prompts)]
    gen = Generator(folder, provider=args.provider, mode="mtp", draft_tokens=max(KS))
    greedy = [gen.generate(ids, args.new_tokens, mode="greedy", stop_at_eos=False).tokens for ids in prompts]

    temps = [float(t) for t in args.temperatures.split(",")]

    def run(t, k, variant, p):
        gen.head_ahead = VARIANTS[variant]
        sampling = {"temperature": t, "top_k": 0, "seed": p} if t else {}
        return gen.generate(prompts[p], args.new_tokens, mode="mtp", draft_tokens=k, stop_at_eos=False, **sampling)

    cases = [(t, k) for t in temps for k in KS]
    for t, k in cases:  # warm-up: every width's CUDA graphs
        for variant in VARIANTS:
            for p in range(len(prompts)):
                run(t, k, variant, p)
    runs = {(t, k, v, p): [] for t, k in cases for v in VARIANTS for p in range(len(prompts))}
    for rep in range(args.repetitions):
        order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
        for t, k in cases:
            for p in range(len(prompts)):
                for variant in order:
                    runs[(t, k, variant, p)].append(run(t, k, variant, p))
    rows = {}
    for t, k in cases:
        prefix = f"T{t:g}_" if t else ""
        for variant in VARIANTS:
            results = [runs[(t, k, variant, p)] for p in range(len(prompts))]
            want = greedy if not t else [runs[(t, k, "plain", p)][0].tokens for p in range(len(prompts))]
            rows[f"{prefix}mtp_k{k}_{variant}"] = {
                "tok_s_median": statistics.median(statistics.median(r.stats.tokens_per_second for r in rs)
                                                  for rs in results),
                "tok_s_runs": [[round(r.stats.tokens_per_second, 2) for r in rs] for rs in results],
                "acceptance_mean": statistics.fmean(rs[-1].stats.acceptance for rs in results),
                # T = 0: streams equal to greedy's; T > 0: equal to the plain variant's first draw
                "identical": sum(all(r.tokens == want[p] for r in rs) for p, rs in enumerate(results)),
                "head_forwards": [rs[-1].stats.forwards.get("head", 0) for rs in results],
            }
        a, b = rows[f"{prefix}mtp_k{k}_ahead"], rows[f"{prefix}mtp_k{k}_plain"]
        print(f"T={t:g} k={k}  ahead {a['tok_s_median']:7.1f}  plain {b['tok_s_median']:7.1f}  "
              f"({100 * (a['tok_s_median'] / b['tok_s_median'] - 1):+.1f}%)  acceptance {a['acceptance_mean']:.3f} / "
              f"{b['acceptance_mean']:.3f}  identical {a['identical']} / {b['identical']} of {len(prompts)}",
              flush=True)
    report["modes"] = rows
    (out_dir(None) / "ab.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
