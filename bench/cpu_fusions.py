"""CPU forward time per width of one model folder under several variants of the driver's sessions, timed
round-robin in one process: by default every rewrite (the driver's default) against the same without the
mlp fusion, the gated-attention fusion, or both.

    python bench/cpu_fusions.py --model /tmp/small [--reps 25] [--threads 2] [--out FILE]
        [--variants default,no-mlp,...] [--library NAME=PATH ...] [--draft-tokens K]

Variants: `default`; `no-<kind>` (every rewrite but ops.rewrite's kind <kind>, e.g. no-mlp);
`neither` (no mlp and no gated-attention fusion); `plain-run-options` (the driver's defaults, but each
run given a RunOptions without the gpu_graph_id entry, as the driver did before driver/device.py set it);
and, for each `--library NAME=PATH`, `NAME`: the driver's defaults on that build of the custom-op
library (ORT_MTP_LIBRARY for that session only), to time two builds of one kernel against each other.
With --draft-tokens K the sessions are MTP Generators' main sessions for K drafts, which carry a window
of K+1 state slots added in memory where the folder has none (ops.state_window), as an MTP run's do.

All sessions live in one process and are timed round-robin per width (2 warm-up forwards, then 10 timed,
per turn), so a noisy machine's slow spells fall on every variant alike; the figure is the median over
--reps turns of the mean forward time. The forwards run at a fixed cache length after a short prompt
(GraphRunner.forward without committing), as a decode step (width 1) and an MTP verify (width k + 1) run
them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402

import driver.device  # noqa: E402
import ops.rewrite  # noqa: E402
from driver import Generator  # noqa: E402
from cpu import run_record, write_result  # noqa: E402  (bench/cpu.py: a result's opening, its file)

WIDTHS = (1, 2, 4)
PROMPT = "def read_config(path):\n    with open(path) as f:\n"


DEFAULT_VARIANTS = ("default", "no-mlp", "no-gated-attention", "neither")


def rewrite_of(variant: str):
    """The Generator's rewrite argument for a variant name (None: not a rewrite variant)."""
    every = ops.rewrite.REWRITES
    if variant in ("default", "plain-run-options"):
        return True
    if variant == "neither":
        return tuple(k for k in every if k not in (ops.rewrite.MLP, ops.rewrite.GATED_ATTENTION))
    if variant.startswith("no-") and variant[3:] in every:
        return tuple(k for k in every if k != variant[3:])
    return None


@contextlib.contextmanager
def session_setting(variant: str, libraries: dict):
    """What a variant changes while its Generator's sessions are made (the run options are made then too)."""
    saved_env, saved_options = os.environ.get("ORT_MTP_LIBRARY"), driver.device.CpuDevice.run_options
    try:
        if variant in libraries:
            os.environ["ORT_MTP_LIBRARY"] = libraries[variant]
        if variant == "plain-run-options":
            driver.device.CpuDevice.run_options = lambda self, graph_id=None: ort.RunOptions()
        yield
    finally:
        driver.device.CpuDevice.run_options = saved_options
        if saved_env is None:
            os.environ.pop("ORT_MTP_LIBRARY", None)
        else:
            os.environ["ORT_MTP_LIBRARY"] = saved_env


def measure(model: str, reps: int, threads: int, variants: list[str], libraries: dict, draft_tokens: int = 0) -> dict:
    """draft_tokens k > 0: each variant's main session is an MTP Generator's (k drafts), which carries a
    window of k+1 state slots where the folder has none (ops.state_window); 0: a greedy Generator's."""
    mode = "mtp" if draft_tokens else "greedy"
    gens = {}
    for name in variants:
        rewrite = True if name in libraries else rewrite_of(name)
        if rewrite is None:
            raise SystemExit(f"unknown variant {name!r}")
        with session_setting(name, libraries):
            gen = Generator(model, mode=mode, draft_tokens=max(draft_tokens, 1), rewrite=rewrite, threads=threads)
            gen.main._options(None)  # the run options are made now, under the variant's setting
        gen.generate(PROMPT, 16, mode="greedy")
        gens[name] = gen
    times = {(name, w): [] for name in gens for w in WIDTHS}
    names = list(gens)
    for rep in range(reps):
        # Every other turn in reverse order, so that no variant is always timed first. That does not make
        # sessions of one build equal: time one build under two names (--library a=P --library b=P) to
        # see how large a difference between variants means nothing on the machine at hand.
        order = names if rep % 2 == 0 else names[::-1]
        for w in WIDTHS:
            for name in order:
                gen = gens[name]
                for _ in range(2):
                    gen.main.forward(w)
                t = time.perf_counter()
                for _ in range(10):
                    gen.main.forward(w)
                times[(name, w)].append((time.perf_counter() - t) / 10 * 1e3)
    return {name: {f"w{w}_ms": round(statistics.median(times[(name, w)]), 4) for w in WIDTHS} for name in gens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="JSON file (default: print only)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma-separated (see above)")
    ap.add_argument("--library", action="append", default=[], metavar="NAME=PATH",
                    help="a variant NAME on the library build at PATH (repeatable)")
    ap.add_argument("--draft-tokens", type=int, default=0, metavar="K",
                    help="time an MTP Generator's main session for K drafts (its state window) instead of a greedy one's")
    args = ap.parse_args()
    libraries = dict(item.split("=", 1) for item in args.library)
    variants = [v for v in args.variants.split(",") if v] + [n for n in libraries if n not in args.variants.split(",")]
    rows = measure(args.model, args.reps, args.threads, variants, libraries, args.draft_tokens)
    for name, row in rows.items():
        print(name, json.dumps(row), flush=True)
    write_result(run_record(model=args.model, reps=args.reps, threads=args.threads, libraries=libraries,
                            draft_tokens=args.draft_tokens, forward_ms=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
