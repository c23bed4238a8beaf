"""Where an MTP Generator's memory goes beyond a greedy one's (24.3 against 19.6 GB on the 27B-class folder,
README.md here): the memory in use after each step of loading and warming up, in one process:

    OUT=DIR python bench/results/2026-12-05-generator-memory/breakdown.py [--folder F] [--provider cuda]

Steps, each a Generator created in a process holding no other (the previous one freed, CuPy's cache
released): greedy (load; one run, which captures the width-1 CUDA graphs), MTP with CUDA graphs (load;
then k = 1, 2, 3, 4 in turn, each run capturing the widths it adds), MTP without CUDA graphs (load; k = 4),
and on CUDA where the memory went back after each Generator was freed. Each step's figure is the growth
since the step before, so the graph captures' share, the head session's and the state window's can be
told apart. --provider cpu reads resident memory (a dry run of the script on a small folder).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from e2e_27b import ensure_folder, git_revision, memory_used  # noqa: E402
from gpu_timing import out_dir  # noqa: E402  ($OUT, else bench/results)

from driver import Generator  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp/models_qwen35_27b")
    ap.add_argument("--provider", default="cuda")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--arena-extend", choices=("default", "same"), default="default",
                    help="same: ONNX Runtime's CUDA arena grows by what each request needs (kSameAsRequested) "
                         "instead of its default doubling, which may reserve memory no tensor uses")
    args = ap.parse_args()
    if args.arena_extend == "same":
        import driver.device

        plain = driver.device.CudaDevice.providers

        def providers(self, graph_capture=False):
            out = plain(self, graph_capture)
            out[0][1]["arena_extend_strategy"] = "kSameAsRequested"
            return out

        driver.device.CudaDevice.providers = providers
    folder = Path(args.folder)
    report = {"command": " ".join(["bench/results/2026-12-05-generator-memory/breakdown.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "revision": git_revision(),
              "provider": args.provider, "arena_extend": args.arena_extend, "build": ensure_folder(folder, 5, None)}
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    prompt = np.random.default_rng(0).integers(0, min(vocab, 8000), 64).tolist()  # e2e_27b.py's first prompt
    steps = []
    last = memory_used(args.provider, release=True)
    report["start_bytes"] = last

    def step(name: str, release: bool = False) -> None:
        nonlocal last
        gc.collect()
        now = memory_used(args.provider, release=release)
        grew = None if now is None or last is None else now - last
        steps.append({"step": name, "bytes": now, "grew": grew})
        print(f"{name:40s} {'-' if grew is None else f'{grew / 1e9:+8.3f} GB'}", flush=True)
        last = now

    greedy = Generator(folder, provider=args.provider, mode="greedy")
    step("greedy: load")
    greedy.generate(prompt, args.new_tokens, mode="greedy", stop_at_eos=False)
    step("greedy: one run (width-1 graphs)")
    del greedy
    step("greedy: freed", release=True)

    for graphs in (True, False):
        label = "mtp" if graphs else "mtp, no graphs"
        gen = Generator(folder, provider=args.provider, mode="mtp", draft_tokens=4, cuda_graphs=graphs)
        step(f"{label}: load")
        shared = gen.shared_weights  # driver.shared_weights (None where the device does not share: the CPU)
        report.setdefault("reused_bytes", {})[label] = shared.reused_bytes if shared is not None else 0
        for k in (1, 2, 3, 4) if graphs else (4,):
            gen.generate(prompt, args.new_tokens, mode="mtp", draft_tokens=k, stop_at_eos=False)
            step(f"{label}: k={k} run")
        del gen
        step(f"{label}: freed", release=True)
    report["steps"] = steps
    name = "breakdown.json" if args.arena_extend == "default" else f"breakdown_arena_{args.arena_extend}.json"
    (out_dir(None) / name).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
