"""Command line of the ops package.

    python -m ops info [--json]
    python -m ops library-path
    python -m ops rewrite IN OUT [--include PAT]... [--exclude PAT]... [--library PATH] [--pack]
                                 [--only matmul|linear-attention|attention|float-matmul|mlp|gated-attention|norm]

IN/OUT: an .onnx file, or an onnxruntime-genai model folder (the folder OUT then also runs in
onnxruntime-genai itself). A user mistake prints one "error: ..." line and exits with status 2.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys

from . import LibraryNotFoundError, cuda_kernels_built, library_path, visible_gpus
from .rewrite import ATTENTION, FLOAT_MATMUL, GATED_ATTENTION, LINEAR_ATTENTION, MATMUL, MLP, NORM, REWRITES, FileReport, FolderReport, RewriteError, rewrite_path
from .staging import OutputError
from .usage import Parser, UsageError


def _parser() -> Parser:
    parser = Parser(prog="python -m ops", description="ort_mtp custom ops for ONNX Runtime")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    info = commands.add_parser(
        "info", help="say what was built and found: the library, its CUDA kernels, ONNX Runtime, GPU, CuPy")
    info.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    commands.add_parser("library-path", help="print the path of the compiled custom-op library")
    rewrite = commands.add_parser(
        "rewrite",
        help="put MatMulNBits nodes and linear-attention blocks on the ort_mtp ops",
        description=(
            "Swap com.microsoft MatMulNBits nodes for ort_mtp MatMulNBits, sharing the same weights, and "
            "replace each linear-attention block (CausalConvWithState ... LinearAttention ... GatedRMSNorm) "
            "with one ort_mtp GatedDeltaNet node where the library has that op; blocks that do not fit "
            "are kept and reported. Where the library runs it (the CPU EP), a gated MLP's gate and up "
            "projections and its SiLU become one ort_mtp MatMulNBits node (activation=swiglu), and a gated "
            "attention mixer one ort_mtp GatedAttention node. "
            "IN and OUT are .onnx files or onnxruntime-genai model folders; OUT must not exist or be "
            "an empty folder, and not be a symbolic link. For a folder every model genai_config.json "
            "names is rewritten, every other file is hard-linked (or copied), and the library is copied in and named in "
            "genai_config.json's session options."),
    )
    rewrite.add_argument("input", metavar="IN", help="model file or onnxruntime-genai model folder")
    rewrite.add_argument("output", metavar="OUT", help="output file or folder")
    pattern_help = ("node-name pattern: a glob (e.g. '/model/layers.*/mlp/*'), or 're:REGEX' searched in "
                    "the name; a linear-attention block goes by its LinearAttention node's name, a gated MLP by its "
                    "Sigmoid node's, an attention mixer by its GroupQueryAttention node's; repeatable")
    rewrite.add_argument("--include", action="append", metavar="PAT",
                         help="rewrite only nodes matching a pattern; " + pattern_help)
    rewrite.add_argument("--exclude", action="append", metavar="PAT",
                         help="leave nodes matching a pattern alone; " + pattern_help)
    rewrite.add_argument("--library", metavar="PATH",
                         help="custom-op library to copy into an output folder (default: the installed one)")
    rewrite.add_argument("--only", action="append", choices=REWRITES, metavar="REWRITE",
                         help="run only this rewrite: " + " or ".join(REWRITES) + " (repeatable; default: all)")
    rewrite.add_argument("--pack", action="store_true",
                         help="also regroup the weights of the nodes that take it into the tiles layout "
                              "(packing=1, faster on CUDA), written to a new <model>.tiles.data file")
    return parser


# -- info -------------------------------------------------------------------------------------------


def _installed_version(*distributions: str) -> str | None:
    """The version of the first of these distributions that is installed (read from its metadata:
    nothing is imported)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _library() -> dict:
    try:
        path = library_path()
    except LibraryNotFoundError as e:
        return {"library": None, "library_error": str(e), "cuda_kernels": None}
    try:
        return {"library": path, "cuda_kernels": cuda_kernels_built(path)}
    except (OSError, ValueError) as e:  # ORT_MTP_LIBRARY names something that is not a library
        return {"library": path, "library_error": str(e), "cuda_kernels": None}


def _cupy() -> dict:
    try:
        import cupy
    except Exception as e:  # not installed (ImportError), or installed against CUDA libraries not found
        return {"cupy": None, "cupy_error": f"{type(e).__name__}: {e}"}
    return {"cupy": cupy.__version__}


def collect_info() -> dict:
    """What `python -m ops info` reports. Cheap: no CUDA context is created, no library is loaded."""
    import onnxruntime as ort

    return {
        "ort_mtp": _installed_version("ort-mtp"),
        **_library(),
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "gpus": visible_gpus(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **_cupy(),
        "onnxruntime_genai": _installed_version("onnxruntime-genai", "onnxruntime-genai-cuda"),
    }


_CUDA_KERNELS = {True: "yes (the library holds device code)",
                 False: "no (CPU kernels only: built without nvcc, or with ORT_MTP_CUDA=OFF)",
                 None: "unknown"}


def info_lines(info: dict) -> list[str]:
    """collect_info() as text: one `label: value` line per item, one per GPU."""
    library = info["library"] or "missing"
    if info.get("library_error"):
        library += f" ({info['library_error']})"
    rows = [("ort-mtp", info["ort_mtp"] or "not installed (running from the sources)"),
            ("library", library),
            ("CUDA kernels", _CUDA_KERNELS[info["cuda_kernels"]]),
            ("onnxruntime", f"{info['onnxruntime']} (providers: {', '.join(info['providers'])})")]
    rows += [("GPU", gpu) for gpu in info["gpus"] or ["none (no NVIDIA driver or device found)"]]
    if info["cuda_visible_devices"] is not None:
        rows.append(("GPU", f"CUDA_VISIBLE_DEVICES={info['cuda_visible_devices']!r} applies to CUDA, not to this list"))
    rows += [("CuPy", info["cupy"] or f"not importable ({info['cupy_error']})"),
             ("onnxruntime-genai", info["onnxruntime_genai"] or "not installed")]
    width = max(len(label) for label, _ in rows) + 2
    return [f"{label + ':':<{width}}{value}" for label, value in rows]


def _print_info(as_json: bool) -> None:
    info = collect_info()
    print(json.dumps(info, indent=2) if as_json else "\n".join(info_lines(info)))


# -- rewrite ----------------------------------------------------------------------------------------


def _first_names(nodes: list[str]) -> str:
    """'a', 'b' and 3 more: the first two names of a reason's nodes, for one line of the report."""
    return ", ".join(repr(n) for n in nodes[:2]) + (f" and {len(nodes) - 2} more" if len(nodes) > 2 else "")


def _print_kept(name: str, kept: list[tuple[str, str]], what: str, where: str) -> None:
    """One note line per reason: "kept <what> 'a', 'b' and N more <where>: <why>"."""
    for why, nodes in _by_reason(kept):
        print(f"note: {name}: kept {what}{_first_names(nodes)} {where}: {why}", file=sys.stderr)


# The summary line of each rewrite kind whose candidates are one BlockReport: the ModelReport field, the
# verb, what was rewritten into what, and how a kept candidate is named and where it stays.
_BLOCK_LINES = {
    ATTENTION: ("attention", "rewrote", "GroupQueryAttention nodes into ort_mtp GroupQueryAttention",
                "GroupQueryAttention ", "as com.microsoft"),
    FLOAT_MATMUL: ("float_matmul", "rewrote", "MatMul nodes into ort_mtp MatMul", "MatMul ", "on ONNX Runtime's"),
    MLP: ("mlp", "fused", "gated MLPs (gate, up, SiLU) into one ort_mtp MatMulNBits each", "the MLP of ",
          "as separate nodes"),
    GATED_ATTENTION: ("gated_attention", "fused", "attention mixers (q/gate split, norms, rotary, attention, gate) "
                      "into ort_mtp GatedAttention", "the attention mixer of ", "as separate nodes"),
    NORM: ("norm", "rewrote", "SkipSimplifiedLayerNormalization nodes into ours", "", "as com.microsoft"),
}


def _print_report(report, pack: bool = False, kinds=REWRITES) -> None:
    if isinstance(report, FileReport):
        models = {report.source.name: report.model}
        where = str(report.output)
    else:
        models = report.models
        where = str(report.output)
    for name, model in models.items():
        total = model.count + len(model.unsupported) + model.filtered_out
        blocks = model.linear_attention
        if MATMUL in kinds and (total or not blocks.total):
            print(f"{name}: rewrote {model.count} of {total} MatMulNBits nodes")
        for node, why in model.unsupported:
            print(f"warning: {name}: kept {node!r} as com.microsoft MatMulNBits: {why}", file=sys.stderr)
        if LINEAR_ATTENTION in kinds and (blocks.total or MATMUL not in kinds):
            print(f"{name}: rewrote {len(blocks.rewritten)} of {blocks.total} linear-attention blocks "
                  "into ort_mtp GatedDeltaNet")
            for why, nodes in _by_reason(blocks.kept):
                shown = _first_names(nodes)
                what = "linear-attention block" if len(nodes) == 1 else f"{len(nodes)} linear-attention blocks"
                print(f"warning: {name}: kept {what} {shown} on com.microsoft ops: {why}",
                      file=sys.stderr)
        for kind, (field, verb, what, kept_what, kept_where) in _BLOCK_LINES.items():
            blocks = getattr(model, field)
            # GroupQueryAttention says "rewrote 0 of N" too: a CUDA build without the kernel keeps them all.
            shown = blocks.total if kind == ATTENTION else blocks.rewritten
            if kind in kinds and (shown or kinds == (kind,)):
                pairs = len(model.float_matmul_merged) if kind == FLOAT_MATMUL else 0
                merged = f" ({pairs} pairs reading one input merged into two-weight nodes)" if pairs else ""
                print(f"{name}: {verb} {len(blocks.rewritten)} of {blocks.total} {what}{merged}")
                _print_kept(name, blocks.kept, kept_what, kept_where)
        if pack and (model.packed or model.not_packed):
            print(f"{name}: packed {model.packed} of {model.packed + len(model.not_packed)} into the tiles layout")
            reasons: dict[str, int] = {}
            for _, why in model.not_packed:
                reasons[why] = reasons.get(why, 0) + 1
            for why, count in sorted(reasons.items()):
                print(f"  {count} left in MatMulNBits' layout: {why}")
    for pattern in report.unmatched_patterns:
        print(f"warning: pattern {pattern!r} matched no MatMulNBits node nor linear-attention block", file=sys.stderr)
    if isinstance(report, FolderReport):
        carried = f"{report.links} files hard-linked, {report.copies} copied"
        library = f"; library {report.library} copied in and named in genai_config.json" if report.library else ""
        print(f"wrote {where} ({carried}{library})")
    else:
        shared = ", ".join(f"{loc} ({how})" for loc, how in report.data_files.items())
        print(f"wrote {where}" + (f"; external data: {shared}" if shared else ""))


def _by_reason(kept: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """Kept blocks grouped by their reason, in the order the reasons first appear. A reason that
    names its block's node is that block's alone; one that does not (the library lacks the op)
    is usually every block's."""
    groups: dict[str, list[str]] = {}
    for node, why in kept:
        why = why[len(node) + 2:] if why.startswith(f"{node}: ") else why  # the line names the block already
        groups.setdefault(why, []).append(node)
    return list(groups.items())


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.command == "info":
            _print_info(args.json)
            return 0
        if args.command == "library-path":
            print(library_path())
            return 0
        report = rewrite_path(args.input, args.output, args.include, args.exclude, args.library,
                              require_rewrite=True, pack=args.pack, rewrites=args.only)
    except (UsageError, RewriteError, OutputError, LibraryNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # permissions, full disk, ...: the system's message names the file
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print_report(report, args.pack, tuple(args.only) if args.only else REWRITES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
