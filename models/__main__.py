"""Command line: python -m models {build,convert,acceptance,sweep,head-folder,train,tokenizer} ...

Errors (bad preset, bad folder, bad option) print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import json
import sys

from ops.staging import OutputError
from ops.usage import Parser, UsageError

from .config import PRECISIONS, PRESETS, BuildOptions, ConfigError, Synthesis, preset


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


# the acceptance measurement's options, shared by `acceptance` and `sweep`
_PROMPTS_HELP = "random prompts to measure (default 4)"
_PROMPT_LENGTH_HELP = "tokens per random prompt (default 32)"
_NEW_TOKENS_HELP = "tokens the target decodes greedily after each prompt (default 64)"


def _parser() -> Parser:
    parser = Parser(prog="python -m models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    b = sub.add_parser("build", help="write a synthetic model folder")
    b.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    b.add_argument("--out", required=True, help="output folder (new or empty)")
    b.add_argument("--precision", default="int4", help=f"one of: {', '.join(PRECISIONS)} (default int4)")
    b.add_argument("--ep", default="cpu", help="cpu or cuda (default cpu)")
    b.add_argument("--state-window", type=int, default=0, help="W per-token conv/recurrent states (on the CPU EP ONNX Runtime's own kernels refuse it: "
                   "the folder then runs on our ops only, the driver's default)")
    b.add_argument("--seed", type=int, default=0, help="seed of every weight (default 0): a seed is one model")
    b.add_argument("--mtp-noise", type=float, default=Synthesis.mtp_noise,
                   help="acceptance knob: noise-to-signal of the MTP head's input (0 = most predictive)")
    b.add_argument("--out-scale", type=float, default=Synthesis.out_scale,
                   help="std of output projections relative to 1/sqrt(fan_in)")
    b.add_argument("--threads", type=int, default=None, help="generator threads (default: all cores)")
    b.add_argument("--overwrite", action="store_true", help="replace a previous build in --out")

    c = sub.add_parser("convert", help="onnxruntime-genai's builder on a Hugging Face checkpoint")
    c.add_argument("hf_dir", help="Hugging Face checkpoint folder (config.json, safetensors, tokenizer)")
    c.add_argument("out", help="output folder (new or empty)")
    c.add_argument("--precision", default="int4", help="int4, int8, bf16, fp16 or fp32 (default int4)")
    c.add_argument("--ep", default="cuda", help="cpu or cuda (default cuda)")
    c.add_argument("--state-window", type=int, default=0,
                   help="W per-token conv/recurrent states (CUDA only; default 0: none)")
    c.add_argument("--exclude-mtp", action="store_true", help="leave the MTP head out of the folder")
    c.add_argument("--cache-dir", default=None, help="builder cache folder (default: a temporary one)")

    a = sub.add_parser("acceptance", help="teacher-forced greedy acceptance of a folder's MTP head (CPU)")
    a.add_argument("folder", help="model folder (a CPU build without a state window)")
    a.add_argument("--prompts", type=int, default=4, help=_PROMPTS_HELP)
    a.add_argument("--prompt-length", type=int, default=32, help=_PROMPT_LENGTH_HELP)
    a.add_argument("--new-tokens", type=int, default=64, help=_NEW_TOKENS_HELP)
    a.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default 0)")

    w = sub.add_parser("sweep", help="acceptance against the knob: builds a preset (CPU) per --mtp-noise value")
    w.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    w.add_argument("--mtp-noise", required=True, help="comma-separated values, e.g. 0,0.1,0.3")
    w.add_argument("--precision", default="int4", help=f"one of: {', '.join(PRECISIONS)} (default int4)")
    w.add_argument("--out-scale", type=float, default=None,
                   help=f"std of output projections relative to 1/sqrt(fan_in) (default {Synthesis.out_scale})")
    w.add_argument("--prompts", type=int, default=4, help=_PROMPTS_HELP)
    w.add_argument("--prompt-length", type=int, default=32, help=_PROMPT_LENGTH_HELP)
    w.add_argument("--new-tokens", type=int, default=64, help=_NEW_TOKENS_HELP)
    w.add_argument("--seed", type=int, default=0, help="seed of the weights and of the random prompts (default 0)")
    w.add_argument("--json", default=None, help="also write the full result here")

    h = sub.add_parser("head-folder", help="a standalone folder for the MTP head (og.MtpGenerator's second model)")
    h.add_argument("folder", help="model folder with an MTP head")
    h.add_argument("out", help="output folder for the head (new or empty, not inside FOLDER)")

    r = sub.add_parser("train", help="train (or continue training) a small model with its MTP head on local Python source")
    r.add_argument("--out", required=True, help="run folder: created, or continued from its last checkpoint")
    r.add_argument("--shape", default="trained-small", help="trained-small (11M parameters and a 1M head) or train-test (a few hundred thousand, for tests)")
    r.add_argument("--minutes", type=float, default=10.0, help="stop after this long (default 10); call again to go on")
    r.add_argument("--steps", type=int, default=None, help="stop after this many more steps")
    r.add_argument("--total-steps", type=int, default=20_000, help="length of the schedule (fixed at the first call)")
    r.add_argument("--batch", type=int, default=16, help="windows per step (fixed at the first call)")
    r.add_argument("--seq-len", type=int, default=256, help="tokens per window (fixed at the first call)")
    r.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    r.add_argument("--corpus-mb", type=float, default=None,
                   help="use only the first files up to this many MB of source (fixed at the first call; default all)")
    r.add_argument("--export", default=None, metavar="HF_DIR",
                   help="then write the Hugging Face folder `python -m models convert` reads")

    t = sub.add_parser("tokenizer", help="retrain the base tokenizer on local text")
    t.add_argument("--out", required=True, help="tokenizer.json file to write")
    return parser


def _build(args) -> dict:
    from .build import build

    options = BuildOptions(
        precision=args.precision,
        ep=args.ep,
        state_window=args.state_window,
        synthesis=Synthesis(seed=args.seed, mtp_noise=args.mtp_noise, out_scale=args.out_scale),
    )
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    return build(preset(args.preset), args.out, options, overwrite=args.overwrite, threads=args.threads).to_json()


def _convert(args) -> dict:
    from .convert import ConvertError, convert

    try:
        return convert(args.hf_dir, args.out, precision=args.precision, ep=args.ep,
                       state_window=args.state_window, exclude_mtp=args.exclude_mtp, cache_dir=args.cache_dir)
    except ConvertError as e:
        raise CliError(str(e)) from None


def _acceptance(args) -> dict:
    from .acceptance import AcceptanceError, measure_folder

    try:
        return measure_folder(args.folder, prompts=args.prompts, prompt_length=args.prompt_length,
                              new_tokens=args.new_tokens, seed=args.seed)
    except AcceptanceError as e:
        raise CliError(str(e)) from None


def _sweep(args) -> dict:
    from .acceptance import AcceptanceError, check_options, markdown_table, sweep

    try:
        noises = [float(x) for x in args.mtp_noise.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--mtp-noise must be comma-separated numbers, got {args.mtp_noise!r}") from None
    if not noises:
        raise CliError("--mtp-noise needs at least one value")
    preset(args.preset)  # fail fast on a bad name
    try:  # before any build (the context length is checked once a folder exists)
        check_options(args.prompts, args.prompt_length, args.new_tokens, args.seed)
    except AcceptanceError as e:
        raise CliError(str(e)) from None
    result = sweep(args.preset, noises, precision=args.precision, out_scale=args.out_scale, prompts=args.prompts,
                   prompt_length=args.prompt_length, new_tokens=args.new_tokens, seed=args.seed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(markdown_table(result), file=sys.stderr)
    return result


def _head_folder(args) -> dict:
    from .head_folder import write_head_folder

    return {"out": str(write_head_folder(args.folder, args.out))}


def _train(args) -> dict:
    from .train.train import TrainError, TrainOptions, export_checkpoint, train

    for name in ("minutes", "total_steps", "batch", "seq_len"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.steps is not None and args.steps < 0:
        raise CliError(f"--steps must be >= 0, got {args.steps}")
    corpus_bytes = None if args.corpus_mb is None else int(args.corpus_mb * 1e6)
    options = TrainOptions(shape=args.shape, total_steps=args.total_steps, batch=args.batch, seq_len=args.seq_len,
                           corpus_bytes=corpus_bytes)
    try:
        result = train(args.out, options, minutes=args.minutes, steps=args.steps,
                       log=lambda line: print(line, file=sys.stderr, flush=True), device=args.device)
        if args.export:
            result["export"] = str(export_checkpoint(args.out, args.export))
    except TrainError as e:
        raise CliError(str(e)) from None
    return result


def _tokenizer(args) -> dict:
    from .tokenizer import default_training_files, train_base_tokenizer

    files = default_training_files()
    tokenizer = train_base_tokenizer(files)
    tokenizer.save(args.out)
    return {"out": args.out, "vocab_size": tokenizer.get_vocab_size(), "training_files": len(files)}


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        result = {"build": _build, "convert": _convert, "acceptance": _acceptance, "sweep": _sweep,
                  "head-folder": _head_folder, "train": _train, "tokenizer": _tokenizer}[args.command](args)
    except (UsageError, CliError, ConfigError, OutputError, FileNotFoundError, NotADirectoryError,
            PermissionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
