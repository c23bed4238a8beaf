"""Is the head's own confidence a usable signal to stop drafting early (a draft length per round)?

Runs MTP with k = --max-k drafts on the CPU and records, for every draft of every round, the head's
confidence in the token it drafted: its softmax probability (p_max) and the margin between its top two
logits (a synthetic head's distribution is flat: every p_max is small), and whether the target accepted
it. Then replays the recorded rounds under "draft while margin >= tau, at least one draft, at most
max-k" for tau at the deciles of the recorded margins
(every decision the driver would make is in the record: the drafts are the same up to where a policy
stops, so the accepted prefix is min(a, k')) and prices each round with per-phase costs measured in the
same process: a head forward (the round's first and the chained ones), the main forward of each width,
the commit copy. The model is a cost model, not a run: it says whether an adaptive length is worth
building, not what it would measure.

    ORT_MTP_LIBRARY=<CPU build> python bench/results/2026-12-05-draft-confidence/probe.py \
        --model /tmp/small --out bench/results/2026-12-05-draft-confidence/small.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from driver import Generator


def record_rounds(gen: Generator, prompts, new_tokens: int, k: int) -> list[dict]:
    """Every round of MTP k on each prompt: the drafts' p_max and the accepted count a."""
    rounds, current = [], []
    pick = gen._pick

    def recording_pick(logits, sampler, keep=None):
        token = pick(logits, sampler, keep)
        if np.shares_memory(logits, gen.head.logits):
            row = np.asarray(logits, dtype=np.float64)
            p = np.exp(row - row.max())
            top2 = np.partition(row, -2)[-2:]
            current.append((float(p[int(token)] / p.sum()), float(top2[1] - top2[0])))
        return token

    gen._pick = recording_pick
    round_fn = gen._mtp_round

    def recording_round(t, k_round, pending, stats, profiler, sampler):
        current.clear()
        before = stats.accepted
        out = round_fn(t, k_round, pending, stats, profiler, sampler)
        if k_round == k:
            rounds.append({"p_max": [c[0] for c in current], "margin": [c[1] for c in current],
                           "a": stats.accepted - before})
        return out

    gen._mtp_round = recording_round
    try:
        for prompt in prompts:
            gen.generate(prompt, new_tokens, draft_tokens=k, stop_at_eos=False)
    finally:
        gen._pick, gen._mtp_round = pick, round_fn
    return rounds


def measure_costs(gen: Generator, k: int, reps: int, rng) -> dict:
    """Median ms of the head's forward of width 1, the main forward of width 1 .. k+1, and the commit copy."""
    vocab = gen.folder.vocab_size
    gen.generate(rng.integers(0, vocab, 32).tolist(), 8, stop_at_eos=False)
    head, main = gen.head, gen.main

    def timed(fn):
        values = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            values.append(time.perf_counter() - start)
        return 1e3 * float(np.median(values[reps // 10:]))

    def head_step():
        head.ids[0, 0] = int(rng.integers(0, vocab))
        head.forward(1)
        np.argmax(head.logits[0, 0])

    costs = {"head_forward": timed(head_step)}
    for w in range(1, k + 2):
        def main_step(w=w):
            main.ids[0, :w] = rng.integers(0, vocab, w)
            main.forward(w)
            np.argmax(main.logits[0, :w], axis=-1)
        costs[f"main_forward_{w}"] = timed(main_step)
    window = main.spec.state_window
    costs["commit"] = timed(lambda: gen.promoter.promote(0, window - 1)) if gen.promoter else 0.0
    return costs


def replay(rounds: list[dict], costs: dict, k_max: int, tau: float | None, fixed_k: int | None = None) -> dict:
    """Tokens and modelled ms over the recorded rounds under one policy."""
    tokens = ms = drafted = 0.0
    for r in rounds:
        if fixed_k is not None:
            k = fixed_k
        else:
            k = 1
            while k < k_max and r["margin"][k] >= tau:
                k += 1
        a = min(r["a"], k)
        tokens += a + 1
        drafted += k
        ms += (k * costs["head_forward"] + costs[f"main_forward_{k + 1}"] + (costs["commit"] if a < k else 0.0)
               + costs.get("round_overhead", 0.0))
    return {"tau": tau, "fixed_k": fixed_k, "tokens_per_round": tokens / len(rounds),
            "drafts_per_round": drafted / len(rounds), "ms_per_round": ms / len(rounds),
            "modelled_tok_s": 1e3 * tokens / ms}


def costs_from_e2e(path: Path, configuration: str = "ours") -> dict:
    """The same cost model's terms from a bench/e2e_27b.py JSON with --phases (the 27B-class folder on a
    GPU): a head forward = k=3's draft phase / 3; the main forward of width w = the verify phase of k = w-1
    (width 1: greedy's ms per token); the commit = k=3's commit phase (per round, charged to the rounds that
    promote: an overestimate where some rounds accept fully); accept + host overhead per round."""
    data = json.loads(path.read_text())
    modes = next(c for c in data["configurations"] if c["label"] == configuration)["modes"]
    phases = {k: modes[f"mtp_k{k}"]["phase_ms_per_round"] for k in range(1, 5)}
    costs = {"head_forward": phases[3]["draft"] / 3, "main_forward_1": 1e3 / modes["greedy"]["tok_s_median"],
             "commit": phases[3]["commit"], "round_overhead": phases[3]["accept"] + phases[3]["host overhead"]}
    for k, ph in phases.items():
        costs[f"main_forward_{k + 1}"] = ph["verify"]
    return costs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--max-k", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--e2e-json", type=Path,
                    help="also price the recorded rounds with a bench/e2e_27b.py --phases JSON's GPU costs (k <= 4)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    k = args.max_k
    gen = Generator(args.model, provider="cpu", mode="mtp", draft_tokens=k, threads=args.threads)
    rng = np.random.default_rng(0)
    vocab = gen.folder.vocab_size
    prompts = [rng.integers(0, vocab, 32).tolist() for _ in range(args.prompts)]
    rounds = record_rounds(gen, prompts, args.new_tokens, k)
    costs = measure_costs(gen, k, args.reps, rng)
    greedy_ms = costs["main_forward_1"]
    # acceptance of a draft the target got to judge (all before it accepted), by margin decile
    judged = [(r["margin"][j], r["p_max"][j], j < r["a"]) for r in rounds for j in range(min(r["a"] + 1, k))]
    deciles = [float(x) for x in np.quantile([m for m, _, _ in judged], np.linspace(0, 1, 11))]
    buckets = []
    for lo, hi in itertools.pairwise(deciles):
        inside = [(p, ok) for m, p, ok in judged if lo <= m < hi or (hi == deciles[-1] and m == hi)]
        buckets.append({"margin": [lo, hi], "drafts": len(inside),
                        "p_max_median": float(np.median([p for p, _ in inside])) if inside else None,
                        "accepted": sum(ok for _, ok in inside) / len(inside) if inside else None})
    fixed = [replay(rounds, costs, k, None, fixed_k=j) for j in range(1, k + 1)]
    adaptive = [replay(rounds, costs, k, tau) for tau in deciles[1:-1]]
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "revision": revision, "model": str(args.model), "max_k": k, "rounds": len(rounds),
              "costs_ms": costs, "greedy_modelled_tok_s": 1e3 / greedy_ms,
              "acceptance_by_margin_decile": buckets, "fixed": fixed, "adaptive": adaptive}
    if args.e2e_json:
        gpu = costs_from_e2e(args.e2e_json)
        gpu_k = min(k, 4)
        result["gpu_cost_model"] = {
            "e2e_json": str(args.e2e_json.resolve().relative_to(ROOT)), "costs_ms": gpu,
            "greedy_tok_s": 1e3 / gpu["main_forward_1"],
            "fixed": [replay(rounds, gpu, gpu_k, None, fixed_k=j) for j in range(1, gpu_k + 1)],
            "adaptive": [replay(rounds, gpu, gpu_k, tau) for tau in deciles[1:-1]]}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"costs_ms": costs, "rounds": len(rounds)}))
    for b in buckets:
        print("margin", [round(x, 3) for x in b["margin"]], "drafts", b["drafts"], "p_max", b["p_max_median"],
              "accepted", b["accepted"])
    for row in fixed + adaptive:
        print(f"fixed_k={row['fixed_k']} tau={row['tau']}: {row['tokens_per_round']:.2f} tokens/round, "
              f"{row['drafts_per_round']:.2f} drafts, {row['ms_per_round']:.2f} ms -> {row['modelled_tok_s']:.1f} tok/s "
              f"({row['modelled_tok_s'] * greedy_ms / 1e3:.2f}x greedy)")
    if "gpu_cost_model" in result:
        g = result["gpu_cost_model"]
        print("GPU costs", g["costs_ms"])
        for row in g["fixed"] + g["adaptive"]:
            print(f"  fixed_k={row['fixed_k']} tau={row['tau']}: {row['tokens_per_round']:.2f} tokens/round, "
                  f"{row['drafts_per_round']:.2f} drafts, {row['ms_per_round']:.2f} ms -> {row['modelled_tok_s']:.1f} tok/s "
                  f"({row['modelled_tok_s'] / g['greedy_tok_s']:.2f}x greedy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
