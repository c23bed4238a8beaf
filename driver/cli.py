"""`python -m driver generate` and `python -m driver identity`.

`generate` prints the prompt and then its continuation, streamed as it is generated, on stdout, and
its stats on stderr (`--json`: one JSON object on stdout instead). Greedy unless --temperature > 0
(then sampled, with --top-k, --top-p, --seed; docs/driver.md#sampling). A user mistake (bad folder,
prompt too long, k out of range, CUDA without a GPU, ...) prints one line `error: ...` on stderr and
exits with status 2, without a traceback.
"""

from __future__ import annotations

import json
import sys

from ops.progress import progress_bar
from ops.usage import Parser, UsageError

from .errors import DriverError
from .generator import COMMIT_POLICIES, DEFAULT_PREFILL_CHUNK, MAX_DRAFT_TOKENS, Generator
from .sampling import SamplingParams, check_sampling

IDENTITY_PROMPT = "The quick brown fox jumps over the lazy dog."


def build_parser() -> Parser:
    parser = Parser(prog="python -m driver", description="Greedy and MTP self-speculative generation.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    gen = sub.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("--model", help="model folder (default: the trained default model the package ships)")
    gen.add_argument("--prompt", required=True, help="prompt text")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    gen.add_argument("--mode", choices=("auto", "greedy", "mtp"), default="auto",
                     help="decoding mode (default auto: " + AUTO_MODE_HELP + ")")
    gen.add_argument("--draft-tokens", type=int,
                     help=f"MTP drafts per round, 1..{MAX_DRAFT_TOKENS} (default: 3 on cuda; on cpu 3 for "
                          "main-model weights of 64 MiB or more, else 1: the fastest measured)")
    gen.add_argument("--provider", choices=("cpu", "cuda"), default="cpu", help="execution provider (default cpu)")
    gen.add_argument("--json", action="store_true", help="print one JSON object (tokens, text, stats) instead")
    gen.add_argument("--profile", action="store_true",
                     help="time each phase of a round (also DRIVER_PROFILE=1); adds device synchronisations")
    gen.add_argument("--commit", choices=COMMIT_POLICIES, default="auto",
                     help="partial-accept commit: auto (promote a slot of the state window: the folder's, "
                          "else one added in memory) or replay (always restore and re-advance; no window added)")
    gen.add_argument("--no-cuda-graphs", action="store_true", help="CUDA: run every forward eagerly")
    gen.add_argument("--no-pack", action="store_true",
                     help="CUDA: keep MatMulNBits' row-major layout (default: the faster tiles layout, its "
                          "weights packed once into ORT_MTP_CACHE_DIR, else ~/.cache/ort-mtp/tiles)")
    gen.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                     help=f"prompt tokens per prefill forward, at most the context length "
                          f"(default {DEFAULT_PREFILL_CHUNK})")
    gen.add_argument("--threads", type=int,
                     help="CPU: intra-op threads, 1 to the cores available (default: ONNX Runtime's choice)")
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="sample at this temperature, in both modes (default 0: greedy decoding)")
    gen.add_argument("--top-k", type=int, default=0,
                     help="sampling: keep the k most probable tokens (default 0: all)")
    gen.add_argument("--top-p", type=float, default=1.0,
                     help="sampling: keep the smallest set of most probable tokens whose probability "
                          "reaches p, in (0, 1] (default 1: all)")
    gen.add_argument("--seed", type=int,
                     help="sampling: seed of the draws, 0 to 2**64-1; the same seed, prompt, mode and k give "
                          "the same tokens (default: a fresh seed, printed in the stats)")

    ident = sub.add_parser("identity", help="measure verify rows against width-1 decode rows, per op")
    ident.add_argument("--model", help="model folder (default: the trained default model)")
    ident.add_argument("--provider", choices=("cpu", "cuda"), default="cpu", help="execution provider (default cpu)")
    ident.add_argument("--prompt", default=IDENTITY_PROMPT,
                       help=f"the prompt whose greedy continuation is verified (default {IDENTITY_PROMPT!r})")
    ident.add_argument("--width", type=int, default=4, help="verify width (k+1) to compare (default 4)")
    ident.add_argument("--no-rewrite", action="store_true",
                       help="keep com.microsoft::MatMulNBits (measure ONNX Runtime's own kernels)")
    ident.add_argument("--streams", action="store_true",
                       help="also compare MTP and greedy token streams over 22 sample prompts for k = 1..8")
    ident.add_argument("--new-tokens", type=int, default=64, help="tokens per stream with --streams (default 64)")
    ident.add_argument("--json", action="store_true", help="print one JSON object (rows, origins, streams) instead")
    return parser


# --mode auto: MTP where the folder has an MTP head, with the draft count measured fastest; greedy for a
# folder without a head. On CUDA a verify costs little more than a decode step, so k=3 pays (README,
# "Measured so far"). On a CPU it depends on the model's size: where the forward streams its weights from
# memory (the small preset, 357 MB) k=3 was the fastest mode in every run
# (bench/results/2026-12-05-cpu-draft-cache); where it is mostly fixed per-node overhead (the 16 MB
# default model) k=1 and k=2 trade places and k=3 trails (bench/results/cpu/default_model.json). Between
# the two sizes nothing was measured: CPU_K3_MIN_BYTES sits between them.
CPU_K3_MIN_BYTES = 64 << 20
AUTO_MODE_HELP = ("mtp where the folder has an MTP head (k=3 on cuda; on cpu k=3 for main-model weights of "
                  "64 MiB or more, else 1), else greedy")


def resolve_mode(mode: str, folder) -> str:
    if mode != "auto":
        return mode
    return "greedy" if folder.mtp is None else "mtp"


def check_mtp_options(args, mode: str, folder) -> None:
    """--draft-tokens and --commit replay shape MTP rounds: with greedy decoding they would be ignored, so
    giving them is a mistake to report (as top-k without a temperature is), not to pass over."""
    if mode != "greedy":
        return
    given = [flag for flag, set_ in (("--draft-tokens", args.draft_tokens is not None),
                                     ("--commit replay", args.commit == "replay")) if set_]
    if not given:
        return
    why = "--mode greedy" if args.mode == "greedy" else f"greedy decoding ({folder.path} has no MTP head)"
    verb = "applies" if len(given) == 1 else "apply"
    raise DriverError(f"{' and '.join(given)} {verb} only to MTP decoding, and this run is {why}")


def resolve_draft_tokens(draft_tokens: int | None, provider: str, folder) -> int:
    if draft_tokens is not None:
        return draft_tokens
    return 1 if provider == "cpu" and folder.main.weight_bytes() < CPU_K3_MIN_BYTES else 3


def resolve_model(path: str | None) -> str:
    if path:
        return path
    from .default_model import default_model_folder

    return str(default_model_folder(log=lambda m: print(m, file=sys.stderr)))


def cmd_generate(args) -> int:
    from .folder import read_folder
    from .text import Text

    sampling = check_sampling(args.temperature, args.top_k, args.top_p, args.seed)  # before any loading
    folder = read_folder(resolve_model(args.model))
    prompt_ids = Text(folder.tokenizer).encode(args.prompt)
    # Buffers sized for this run: the prompt, the new tokens, and the widest verify beyond them.
    need = len(prompt_ids) + max(args.max_new_tokens, 1)
    mode = resolve_mode(args.mode, folder)
    check_mtp_options(args, mode, folder)
    generator = Generator(folder, provider=args.provider, mode=mode,
                          draft_tokens=resolve_draft_tokens(args.draft_tokens, args.provider, folder),
                          max_length=max(2, min(folder.context_length, need)), prefill_chunk=args.prefill_chunk,
                          cuda_graphs=not args.no_cuda_graphs, commit=args.commit,
                          profile=True if args.profile else None, threads=args.threads,
                          pack=False if args.no_pack else None)
    generator.check_lengths(len(prompt_ids), args.max_new_tokens)
    if args.json:
        result = run_generation(generator, prompt_ids, args.max_new_tokens, sampling=sampling)
        out = result.as_dict()
        out.update(model=str(folder.path), provider=args.provider, prompt=args.prompt, mode=mode,
                   mode_chosen_by="auto" if args.mode == "auto" else "option")
        print(json.dumps(out))
        return 0
    sys.stdout.write(args.prompt)  # the continuation follows it, streamed as it is generated
    sys.stdout.flush()
    result = run_generation(generator, prompt_ids, args.max_new_tokens, text=generator.text.stream(),
                            sampling=sampling)
    print()
    print_stats(result.stats, f"mode {mode} (--mode auto on {args.provider})" if args.mode == "auto" else None)
    return 0


def run_generation(generator: Generator, prompt_ids: list[int], max_new_tokens: int, text=None,
                   sampling: SamplingParams = SamplingParams()):
    """Generates, writing each batch of committed tokens to stdout through `text` (a TextStream), if
    given. A bar on stderr counts the tokens where stderr is a terminal, unless the text is streaming
    to a terminal itself: it shows the progress there, and a bar would break its lines."""
    streams_to_terminal = text is not None and sys.stdout.isatty()
    with progress_bar("generating", total=max_new_tokens, unit="token", enabled=not streams_to_terminal) as bar:
        def committed(tokens):
            if text is not None:
                sys.stdout.write(text.push(tokens))
                sys.stdout.flush()
            bar.update(len(tokens))

        return generator.generate(prompt_ids, max_new_tokens, on_tokens=committed, temperature=sampling.temperature,
                                  top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.seed)


def print_stats(stats, note: str | None = None) -> None:
    """The summary on stderr, so that stdout holds the prompt and its continuation alone."""
    print(stats.line() + (f" | {note}" if note else ""), file=sys.stderr)
    if stats.phase_ms:
        per_round = stats.as_dict().get("phase_ms_per_round", {})
        print("ms per round: " + " ".join(f"{k}={v:.3f}" for k, v in per_round.items()), file=sys.stderr)


def cmd_identity(args) -> int:
    from . import identity
    from .folder import read_folder
    from .text import Text

    folder = read_folder(resolve_model(args.model))
    if not 2 <= args.width <= MAX_DRAFT_TOKENS + 1:
        raise DriverError(f"--width must be from 2 to {MAX_DRAFT_TOKENS + 1}, got {args.width}")
    prompt = Text(folder.tokenizer).encode(args.prompt)
    if not prompt:
        raise DriverError("the prompt is empty")
    # The tokens to verify: what greedy decoding itself produces after the prompt.
    rewrite = not args.no_rewrite
    # pack=False: identity measures the row-major layout (driver/identity.py says why)
    greedy = Generator(folder, provider=args.provider, mode="greedy", cuda_graphs=False, rewrite=rewrite, pack=False,
                       max_length=min(folder.context_length, len(prompt) + args.width + 1))
    tokens = greedy.generate(prompt, args.width, stop_at_eos=False).tokens
    result = identity.rows(folder, prompt, tokens, provider=args.provider, rewrite=rewrite,
                           max_length=min(folder.context_length, len(prompt) + args.width + 1))
    ops_report = identity.per_op(folder, prompt, tokens, provider=args.provider, rewrite=rewrite)
    summary = identity.summarize_ops(ops_report)
    stream_report = None
    if args.streams:
        longest = max(len(Text(folder.tokenizer).encode(p)) for p in identity.SAMPLE_PROMPTS)
        mtp = Generator(folder, provider=args.provider, mode="mtp", rewrite=rewrite, pack=False,
                        max_length=min(folder.context_length, longest + args.new_tokens))
        stream_report = identity.streams(mtp, identity.SAMPLE_PROMPTS, args.new_tokens, range(1, MAX_DRAFT_TOKENS + 1))
    if args.json:
        print(json.dumps({"model": str(folder.path), "provider": args.provider, "rows": result,
                          "origins": [{"op": op, "nodes": n, "max_diff": d} for op, n, d in summary],
                          "streams": stream_report}))
        return 0
    matmul = "ort_mtp" if rewrite else "com.microsoft"
    print(f"width {result['width']} verify vs width-1 decode on {folder.path} ({args.provider}, {matmul} "
          f"MatMulNBits):")
    print(f"  logits rows bit-identical: {result['logits_rows_equal']} (max diff "
          f"{max(result['logits_max_diff']):.3g}); argmax equal: {result['argmax_equal']}")
    print(f"  hidden rows bit-identical: {result['hidden_rows_equal']}")
    print(f"  KV cache max diff {result['kv_max_diff']:.3g}; linear-attention state max diff "
          f"{result['state_max_diff']:.3g}")
    if summary:
        print("  ops whose output rows differ although their input rows are equal:")
        for op, nodes, diff in summary:
            print(f"    {op}: {nodes} node(s), max diff {diff:.3g}")
    else:
        print("  every op's rows are bit-identical")
    for row in stream_report or []:
        print(f"  k={row['k']}: MTP == greedy on {row['identical']}/{row['prompts']} prompts "
              f"({args.new_tokens} tokens each), acceptance {row['acceptance']:.3f}, "
              f"{row['tokens_per_round']:.2f} tokens/round, commits {row['commits']}")
    return 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "generate":
            return cmd_generate(args)
        return cmd_identity(args)
    except (DriverError, UsageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
