"""The shipped default model (models/data/trained, `python -m models train` then `convert`): its
acceptance and speed on held-out Python files, on the CPU, greedy against MTP k = 1..4, and a few
sample completions.

    python bench/default_model.py [--new-tokens 64] [--threads 2] [--out bench/results/cpu/default_model.json]
    python bench/default_model.py --make-prompts RUN_FOLDER   # writes models/data/trained/heldout_prompts.json

The prompts (heldout_prompts.json) are the openings of standard-library files the training run held
out (its corpus.json), from their first `def` or `class` line, cut at a line end near 400 characters:
text the model never trained on. Acceptance = accepted drafts / drafts; tokens per round = accepted + 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.defaults import TRAINED_FOLDER  # noqa: E402
from cpu import run_record, write_result  # noqa: E402  (bench/cpu.py: a result's opening, its file)

PROMPTS = TRAINED_FOLDER / "heldout_prompts.json"
PASSES = 3
SAMPLES = ["def read_config(path):", "class Stack:\n    def __init__(self):", "import os\n\n\ndef main():"]


def make_prompts(run: Path, count: int = 24) -> list[dict]:
    manifest = json.loads((run / "corpus.json").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for entry in sorted(manifest, key=lambda e: e["name"]):
        if not (entry["held_out"] and entry["name"].startswith("stdlib/") and entry["bytes"] >= 1500):
            continue
        text = (stdlib / entry["name"][len("stdlib/"):]).read_text(encoding="utf-8")
        starts = [i for i, line in enumerate(text.splitlines(keepends=True)) if line.startswith(("def ", "class "))]
        if not starts:
            continue
        lines = text.splitlines(keepends=True)[starts[0]:]
        prompt = ""
        for line in lines:
            if len(prompt) + len(line) > 400:
                break
            prompt += line
        if len(prompt) >= 100:
            prompts.append({"file": entry["name"], "prompt": prompt})
        if len(prompts) == count:
            break
    return prompts


def measure(new_tokens: int, threads: int) -> dict:
    from driver import Generator

    prompts = [p["prompt"] for p in json.loads(PROMPTS.read_text())]
    modes = (("greedy", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3), ("mtp", 4))
    # Each mode and k on its own Generator, as the CLI runs them (an MTP Generator adds a state window of
    # k+1 slots in memory, which a greedy step on it would pay for: docs/driver.md).
    gens = {k: Generator(TRAINED_FOLDER, provider="cpu", mode=mode, draft_tokens=max(k, 1), max_length=1024,
                         threads=threads) for mode, k in modes}
    per = {k: [] for _, k in modes}
    # Modes interleaved per prompt and the prompts run PASSES times, so that a noisy machine's slow
    # spells fall on every mode alike; tok/s is the median over prompts and passes.
    for rep in range(PASSES):
        for i, prompt in enumerate(prompts):
            greedy = None
            for _, k in modes:
                gens[k].generate(prompt, 8, stop_at_eos=False)  # warm
                result = gens[k].generate(prompt, new_tokens, stop_at_eos=False)
                s = result.stats.as_dict()
                if not k:
                    greedy = result.tokens
                per[k].append({"tok_s": s["tokens_per_second"], "acceptance": s["acceptance"],
                               "tokens_per_round": s["tokens_per_round"], "same_as_greedy": result.tokens == greedy,
                               "first_pass": rep == 0})
    rows = {}
    for mode, k in modes:
        first = [p for p in per[k] if p["first_pass"]]  # token counts: one pass (every pass prints the same)
        name = "greedy" if not k else f"mtp_k{k}"
        rows[name] = {"tok_s_median": statistics.median(p["tok_s"] for p in per[k]),
                      "acceptance_mean": statistics.fmean(p["acceptance"] for p in first) if k else None,
                      "tokens_per_round_mean": statistics.fmean(p["tokens_per_round"] for p in first) if k else None,
                      "same_as_greedy": sum(p["same_as_greedy"] for p in first), "prompts": len(first)}
        print(name, json.dumps({k2: v for k2, v in rows[name].items()}), flush=True)
    samples = {p: gens[0].generate(p, 48, stop_at_eos=False).text for p in SAMPLES}
    return {"modes": rows, "samples": samples}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu" / "default_model.json"))
    ap.add_argument("--make-prompts", metavar="RUN", default=None)
    args = ap.parse_args()
    if args.make_prompts:
        prompts = make_prompts(Path(args.make_prompts))
        PROMPTS.write_text(json.dumps(prompts, indent=1))
        print(f"wrote {len(prompts)} prompts to {PROMPTS}")
        return 0
    write_result(run_record(new_tokens=args.new_tokens, threads=args.threads,
                            **measure(args.new_tokens, args.threads)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
