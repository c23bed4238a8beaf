"""Would drafting over a frequent-token subset of the vocabulary pay on the models we have?

The head's lm_head over the full vocabulary is the largest part of a draft (issues 18 and 23 name the
subset as a lever: drafts only, so the output cannot change, only the acceptance). Two measurements:

1. What the subset costs in acceptance: teacher-forced (models.acceptance's method: the target decodes
   greedily on ORT's CPU ops, the head drafts t_{i+2} from the pair (t_{i+1}, h_i)), the draft taken as
   the argmax over the full vocabulary and over the S most frequent ids only. The subset comes from data
   the evaluation prompts are not part of: the target's own greedy streams on the other half of the
   prompts ("self"), and for the trained default model also the token counts of its training files
   ("corpus", the standard-library files its manifest marks as training files, first --corpus-mb MB).
2. What the subset would save: the lm_head node's share of a head forward on the driver's CPU path
   (ORT's node profile, our ops, 2 threads).

    python bench/results/2026-12-05-draft-vocab/probe.py --small /tmp/small --out probe.json
    (ORT_MTP_LIBRARY may point at a CPU build of the library; the default model needs no argument)

The 27B-class folder is too large for this machine; bench/results/2026-12-05-mlp-cuda/b/e2e_27b.json holds
its greedy streams (4 prompts x 256 tokens), whose token counts --e2e-json reads.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from models.acceptance import Session, greedy_with_hidden
from models.defaults import TRAINED_FOLDER


def streams(folder: Path, prompts: list[list[int]], new_tokens: int) -> list[dict]:
    """Per prompt: the generated tokens and each one's full-vocabulary head logits row (teacher-forced)."""
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    head_size = config["decoder"]["head_size"]
    main, head = Session(folder / "model.onnx", head_size), Session(folder / "mtp.onnx", head_size)
    out = []
    for prompt in prompts:
        tokens, hidden = greedy_with_hidden(main, np.array(prompt), new_tokens)
        pairs = len(tokens) - 1
        dtype = np.float16 if head.inputs["hidden_states"].type == "tensor(float16)" else np.float32
        logits = head.run(np.array([tokens[1:]]), 0, head.empty_past(), hidden[None, :pairs].astype(dtype))["logits"][0]
        first = len(prompt) + 1  # the first generated token whose draft comes from a generated context
        out.append({"generated": tokens[len(prompt):],
                    "targets": tokens[first:],
                    "draft_logits": logits[first - 2:len(tokens) - 2]})  # row j drafts targets[j]
    return out


def acceptance(evaluation: list[dict], subset: np.ndarray | None) -> float:
    hits = trials = 0
    for s in evaluation:
        rows = s["draft_logits"] if subset is None else s["draft_logits"][:, subset]
        drafts = np.argmax(rows, axis=-1)
        if subset is not None:
            drafts = subset[drafts]
        hits += int((drafts == np.array(s["targets"])).sum())
        trials += len(s["targets"])
    return hits / trials


def top(counts: collections.Counter, size: int) -> np.ndarray:
    return np.array(sorted(t for t, _ in counts.most_common(size)), dtype=np.int64)


def subset_table(calibration_streams: list[dict], evaluation: list[dict], sizes: list[int],
                 corpus: collections.Counter | None) -> dict:
    sources = {"self": collections.Counter(t for s in calibration_streams for t in s["generated"])}
    if corpus is not None:
        sources["corpus"] = corpus
    generated = [t for s in evaluation for t in s["generated"]]
    rows = []
    for name, counts in sources.items():
        for size in sizes:
            subset = top(counts, size)
            rows.append({"source": name, "size": size, "ids_available": len(counts),
                         "coverage": float(np.isin(generated, subset).mean()),
                         "acceptance": acceptance(evaluation, subset)})
    return {"acceptance_full": acceptance(evaluation, None),
            "distinct_generated": len(set(generated)), "generated": len(generated), "subsets": rows}


def corpus_counts(tokenizer_path: Path, megabytes: float) -> collections.Counter:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    with gzip.open(TRAINED_FOLDER / "corpus.json.gz") as f:
        manifest = json.load(f)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    counts, read = collections.Counter(), 0
    for entry in sorted(manifest, key=lambda e: e["name"]):
        if entry["held_out"] or not entry["name"].startswith("stdlib/"):
            continue
        path = stdlib / entry["name"][len("stdlib/"):]
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        counts.update(tokenizer.encode(text).ids)
        read += len(text)
        if read >= megabytes * 1e6:
            break
    return counts


def head_profile(folder: Path, prompt: list[int]) -> dict:
    """ORT's node profile of the driver's CPU head forwards (k=3: two of a round's three are width 1),
    each node's median time: the lm_head's share of their sum."""
    import onnxruntime as ort

    plain = ort.SessionOptions
    where = tempfile.mkdtemp(prefix="draft-vocab-profile-")

    def profiled():
        options = plain()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(where, "p")
        return options

    ort.SessionOptions = profiled
    try:
        from driver import Generator

        gen = Generator(folder, provider="cpu", mode="mtp", draft_tokens=3, threads=2)
    finally:
        ort.SessionOptions = plain
    for _ in range(4):
        gen.generate(prompt, 48, stop_at_eos=False)
    with open(gen.head.session.end_profiling()) as f:
        events = json.load(f)
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    times = collections.defaultdict(list)
    for e in nodes:
        times[e["name"][:-len("_kernel_time")]].append(e["dur"])
    lm = [n for n in times if "lm_head" in n]
    medians = {n: float(np.median(v)) for n, v in times.items()}
    total = sum(medians.values())
    return {"node_median_us": medians, "lm_head_us": sum(medians[n] for n in lm), "all_nodes_us": total,
            "lm_head_share": sum(medians[n] for n in lm) / total}


def e2e_counts(path: Path) -> dict:
    data = json.loads(path.read_text())
    prompts = data["configurations"][0]["modes"]["greedy"]["prompts"]
    streams_ = [p["tokens"] for p in prompts]
    half = len(streams_) // 2
    counts = collections.Counter(t for s in streams_[:half] for t in s)
    held = [t for s in streams_[half:] for t in s]
    all_tokens = [t for s in streams_ for t in s]
    return {"file": str(path.resolve().relative_to(ROOT)), "generated": len(all_tokens),
            "distinct_generated": len(set(all_tokens)),
            "subsets": [{"source": "self", "size": size, "ids_available": len(counts),
                         "coverage": float(np.isin(held, top(counts, size)).mean())}
                        for size in (4096, 16384, 65536)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=Path, help="a CPU folder of the small preset (python -m models build --preset small --ep cpu)")
    parser.add_argument("--e2e-json", type=Path, default=ROOT / "bench/results/2026-12-05-mlp-cuda/b/e2e_27b.json")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--corpus-mb", type=float, default=4.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "revision": revision, "new_tokens": args.new_tokens}

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TRAINED_FOLDER / "tokenizer.json"))
    prompts = [tokenizer.encode(p["prompt"]).ids for p in json.loads((TRAINED_FOLDER / "heldout_prompts.json").read_text())]
    s = streams(TRAINED_FOLDER, prompts, args.new_tokens)
    half = len(s) // 2
    result["default_model"] = {
        "prompts": len(prompts), "calibration_prompts": half,
        **subset_table(s[:half], s[half:], [256, 512, 1024, 2048, 4096],
                       corpus_counts(TRAINED_FOLDER / "tokenizer.json", args.corpus_mb)),
        "head_profile": head_profile(TRAINED_FOLDER, prompts[0]),
    }
    if args.small:
        config = json.loads((args.small / "genai_config.json").read_text())["model"]
        rng = np.random.default_rng(0)
        specials = set(config["eos_token_id"]) | {config["pad_token_id"], config["bos_token_id"]}
        ids = [rng.integers(256, min(config["vocab_size"], min(specials)), size=32).tolist() for _ in range(8)]
        s = streams(args.small, ids, args.new_tokens)
        result["small"] = {"folder": str(args.small), "prompts": len(ids), "calibration_prompts": 4,
                           **subset_table(s[:4], s[4:], [1024, 4096, 8192, 16384], None),
                           "head_profile": head_profile(args.small, ids[0])}
    if args.e2e_json and args.e2e_json.is_file():
        result["qwen35_27b_streams"] = e2e_counts(args.e2e_json)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name in ("default_model", "small"):
        if name in result:
            r = result[name]
            print(name, "acceptance full", round(r["acceptance_full"], 3), "distinct", r["distinct_generated"], "of", r["generated"],
                  "lm_head share", round(r["head_profile"]["lm_head_share"], 3))
            for row in r["subsets"]:
                print("  ", row["source"], row["size"], "coverage", round(row["coverage"], 3), "acceptance", round(row["acceptance"], 3))
    if "qwen35_27b_streams" in result:
        print("27B", result["qwen35_27b_streams"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
