"""Device script: build the Qwen3.5-27B-class synthetic folder and check one greedy forward on CUDA.

    PYTHONPATH=/tmp/site python bench/build_27b.py --state-window 4 --json $OUT/models_qwen35_27b.json

Steps, each timed, the JSON rewritten after each so a cut-off run still reports how far it got:
1. build `--preset` (default qwen35-27b) as int4 for the CUDA EP into --scratch (not $OUT: ~18 GB);
   a folder already built there with the same options is reused unless --rebuild;
2. size on disk (every file) and the disk's free space;
3. an ORT CUDA-EP session of model.onnx -- with every intermediate value of the graph added as an
   output (a copy of the graph, model_all_outputs.onnx, reading the same model.onnx.data) --
   prefill of a short prompt + --decode-steps greedy steps, feeding present.* back as past.*
   (plain session.run, host copies: a check, not a benchmark); every output and every
   intermediate of every step must be finite (fp16 all the way through);
4. the MTP head (mtp.onnx) over the prefill's (token, hidden) pairs: finite, and how often its
   argmax equals the target's greedy next-next token.
Exit status 0 only if the build finished and every checked value was finite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import models`

from models.build import FOLDER_FILES, build  # noqa: E402
from models.config import BuildOptions, Synthesis, preset  # noqa: E402

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Report:
    def __init__(self, path: Path):
        self.path = path
        self.data: dict = {"ok": False}

    def update(self, **items) -> None:
        self.data.update(items)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2))


def build_or_reuse(args, report: Report) -> Path:
    folder = Path(args.scratch)
    options = BuildOptions(
        precision="int4", ep="cuda", state_window=args.state_window,
        synthesis=Synthesis(seed=args.seed, mtp_noise=args.mtp_noise),
    )
    stamp = folder / "build_info.json"
    wanted = {"preset": args.preset, "precision": "int4", "ep": "cuda", "state_window": args.state_window,
              "seed": args.seed, "mtp_noise": args.mtp_noise}
    if stamp.is_file() and not args.rebuild:
        info = json.loads(stamp.read_text())
        if {k: info.get(k) for k in wanted} == wanted and all((folder / f).is_file() for f in FOLDER_FILES):
            log(f"reusing the folder built earlier in {folder} ({info['seconds']:.1f} s then)")
            report.update(build=info, reused_folder=True)
            return folder
    if folder.exists():
        shutil.rmtree(folder)
    log(f"building {args.preset} int4/cuda state_window={args.state_window} into {folder} with {args.threads or os.cpu_count()} threads")
    result = build(preset(args.preset), folder, options, threads=args.threads).to_json()
    stamp.write_text(json.dumps(result, indent=2))
    log(f"built in {result['seconds']:.1f} s, {result['bytes_on_disk'] / 1e9:.2f} GB")
    report.update(build=result, reused_folder=False)
    return folder


def with_all_outputs(folder: Path) -> tuple[Path, list[str]]:
    """A copy of model.onnx whose outputs include every intermediate value (same data file)."""
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    present = {o.name for o in model.graph.output}
    extra = [v for v in model.graph.value_info
             if v.name.startswith("/model/") and not v.name.startswith("/model/constants/") and v.name not in present]
    model.graph.output.extend(extra)
    path = folder / "model_all_outputs.onnx"
    path.write_bytes(model.SerializeToString())
    return path, [v.name for v in extra]


def make_session(path: Path, ort, provider: str):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    providers = ["CPUExecutionProvider"] if provider == "cpu" else [("CUDAExecutionProvider", {}), "CPUExecutionProvider"]
    return ort.InferenceSession(str(path), options, providers=providers)


def zero_past(session, head_size: int) -> dict:
    past = {}
    for info in session.get_inputs():
        if info.name.startswith(("past_key_values.", "past.")):
            dims = [1 if d == "batch_size" else 0 if d == "past_sequence_length" else head_size if d == "kv_cache_dim" else d
                    for d in info.shape]
            past[info.name] = np.zeros(dims, np.float16)
    return past


def feeds_for(tokens: list[int], start: int, past: dict) -> dict:
    n = len(tokens)
    return {
        "input_ids": np.array([tokens], np.int64),
        "attention_mask": np.ones((1, start + n), np.int64),
        "position_ids": np.tile(np.arange(start, start + n, dtype=np.int64), (3, 1, 1)),
        **past,
    }


def as_past(outputs: dict) -> dict:
    past = {}
    for name, value in outputs.items():
        if name.startswith("present."):
            rest = name[len("present."):]
            past[f"past_key_values.{rest}" if rest.endswith((".key", ".value")) else f"past.{rest}"] = value
    return past


def non_finite(outputs: dict) -> list[str]:
    return [name for name, value in outputs.items() if value.dtype.kind == "f" and not np.isfinite(value).all()]


def check_forward(folder: Path, args, report: Report) -> bool:
    import onnxruntime as ort

    if args.provider == "cuda" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA/cuDNN from the image's nvidia-* wheels
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    head_size = config["decoder"]["head_size"]
    from tokenizers import Tokenizer

    prompt = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT).ids

    debug_model, intermediates = with_all_outputs(folder)
    start = time.perf_counter()
    session = make_session(debug_model, ort, args.provider)
    load_s = time.perf_counter() - start
    providers = session.get_providers()
    log(f"model.onnx session in {load_s:.1f} s, providers {providers}")
    report.update(session={"load_seconds": load_s, "providers": providers, "checked_intermediates": len(intermediates)})
    if args.provider == "cuda" and providers[0] != "CUDAExecutionProvider":
        report.update(error="CUDA EP not available")
        return False

    names = [o.name for o in session.get_outputs()]
    steps, bad, tokens, hidden_rows = [], [], list(prompt), []
    past, position = zero_past(session, head_size), 0
    feed_tokens = list(prompt)
    for step in range(args.decode_steps + 1):
        outputs = dict(zip(names, session.run(None, feeds_for(feed_tokens, position, past))))
        bad += [f"step {step}: {name}" for name in non_finite(outputs)]
        next_token = int(np.argmax(outputs["logits"][0, -1]))
        hidden_rows.append(outputs["hidden_states"][0])
        residual = [float(np.abs(outputs[name].astype(np.float32)).max()) for name in outputs
                    if name.endswith("/post_attention_layernorm/output_3")]
        steps.append({"tokens_in": len(feed_tokens), "next_token": next_token,
                      "max_abs_logit": float(np.abs(outputs["logits"].astype(np.float32)).max()),
                      "max_abs_hidden": float(np.abs(outputs["hidden_states"].astype(np.float32)).max()),
                      "max_abs_residual_per_layer": residual})
        log(f"step {step}: {len(feed_tokens)} tokens -> {next_token}, non-finite so far: {len(bad)}")
        position += len(feed_tokens)
        past = as_past({k: v for k, v in outputs.items() if k.startswith("present.")})
        tokens.append(next_token)
        feed_tokens = [next_token]
    report.update(forward={"prompt_tokens": len(prompt), "decode_steps": args.decode_steps, "steps": steps,
                           "generated": tokens[len(prompt):], "non_finite": bad, "all_finite": not bad})
    del session
    debug_model.unlink()

    head = make_session(folder / "mtp.onnx", ort, args.provider)
    hidden = np.concatenate(hidden_rows, axis=0)[None, : len(tokens) - 2]  # h_0 .. h_{n-3}
    pairs = hidden.shape[1]
    head_out = dict(zip([o.name for o in head.get_outputs()],
                        head.run(None, {**feeds_for(tokens[1 : pairs + 1], 0, zero_past(head, head_size)), "hidden_states": hidden})))
    drafts = np.argmax(head_out["logits"][0], axis=-1)  # drafts[i] predicts tokens[i + 2]
    targets = np.array(tokens[2 : pairs + 2])
    generated = slice(len(prompt) - 1, pairs)  # drafts for tokens the target generated
    head_bad = non_finite(head_out)
    report.update(mtp={"pairs": pairs, "non_finite": head_bad, "all_finite": not head_bad,
                       "agree_on_generated": int((drafts[generated] == targets[generated]).sum()),
                       "generated_pairs": int(len(targets[generated]))})
    log(f"mtp head: finite={not head_bad}, agrees with the target on "
        f"{int((drafts[generated] == targets[generated]).sum())}/{len(targets[generated])} generated tokens")
    return not bad and not head_bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen35-27b")
    parser.add_argument("--state-window", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mtp-noise", type=float, default=Synthesis.mtp_noise)
    parser.add_argument("--scratch", default="/tmp/models_qwen35_27b", help="where the folder is built (not $OUT)")
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "models_qwen35_27b.json"))
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--provider", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: dry run of the script itself on a small preset (needs --state-window 0)")
    args = parser.parse_args()
    if args.provider == "cpu" and args.state_window:
        parser.error("--provider cpu needs --state-window 0 (ORT's CPU kernels have no state window)")

    report = Report(Path(args.json))
    report.update(args=vars(args), started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), cpu_count=os.cpu_count())
    try:
        folder = build_or_reuse(args, report)
        usage = shutil.disk_usage(folder)
        files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
        report.update(size_on_disk_bytes=sum(files.values()), files=files, disk_free_bytes=usage.free)
        ok = True if args.build_only else check_forward(folder, args, report)
    except Exception as e:  # the report must say what failed even when the run dies
        report.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        log(f"failed: {type(e).__name__}: {e}")
        return 1
    report.update(ok=ok, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    log(f"done: ok={ok}, report {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
