"""Command line of the ops package.

    python -m ops library-path
    python -m ops rewrite IN OUT [--include PAT]... [--exclude PAT]... [--library PATH] [--pack]

IN/OUT: an .onnx file, or an onnxruntime-genai model folder (the folder OUT then also runs in
onnxruntime-genai itself). A user mistake prints one "error: ..." line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys

from . import LibraryNotFoundError, library_path
from .rewrite import FileReport, FolderReport, RewriteError, rewrite_path
from .staging import OutputError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ops", description="ort_mtp custom ops for ONNX Runtime")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("library-path", help="print the path of the compiled custom-op library")
    rewrite = commands.add_parser(
        "rewrite",
        help="swap com.microsoft MatMulNBits nodes for ort_mtp MatMulNBits",
        description=(
            "Swap com.microsoft MatMulNBits nodes for ort_mtp MatMulNBits, sharing the same weights. "
            "IN and OUT are .onnx files or onnxruntime-genai model folders; OUT must not exist or be "
            "an empty folder, and not be a symbolic link. For a folder every model genai_config.json "
            "names is rewritten, every other file is hard-linked (or copied), and the library is copied in and named in "
            "genai_config.json's session options."),
    )
    rewrite.add_argument("input", metavar="IN", help="model file or onnxruntime-genai model folder")
    rewrite.add_argument("output", metavar="OUT", help="output file or folder")
    pattern_help = ("node-name pattern: a glob (e.g. '/model/layers.*/mlp/*'), or 're:REGEX' searched in "
                    "the name; repeatable")
    rewrite.add_argument("--include", action="append", metavar="PAT",
                         help="rewrite only nodes matching a pattern; " + pattern_help)
    rewrite.add_argument("--exclude", action="append", metavar="PAT",
                         help="leave nodes matching a pattern alone; " + pattern_help)
    rewrite.add_argument("--library", metavar="PATH",
                         help="custom-op library to copy into an output folder (default: the installed one)")
    rewrite.add_argument("--pack", action="store_true",
                         help="also regroup the weights of the nodes that take it into the tiles layout "
                              "(packing=1, faster on CUDA), written to a new <model>.tiles.data file")
    return parser


def _print_report(report, pack: bool = False) -> None:
    if isinstance(report, FileReport):
        models = {report.source.name: report.model}
        where = str(report.output)
    else:
        models = report.models
        where = str(report.output)
    for name, model in models.items():
        total = model.count + len(model.unsupported) + model.filtered_out
        print(f"{name}: rewrote {model.count} of {total} MatMulNBits nodes")
        for node, why in model.unsupported:
            print(f"warning: {name}: kept {node!r} as com.microsoft MatMulNBits: {why}", file=sys.stderr)
        if pack and (model.packed or model.not_packed):
            print(f"{name}: packed {model.packed} of {model.packed + len(model.not_packed)} into the tiles layout")
            reasons: dict[str, int] = {}
            for _, why in model.not_packed:
                reasons[why] = reasons.get(why, 0) + 1
            for why, count in sorted(reasons.items()):
                print(f"  {count} left in MatMulNBits' layout: {why}")
    for pattern in report.unmatched_patterns:
        print(f"warning: pattern {pattern!r} matched no MatMulNBits node", file=sys.stderr)
    if isinstance(report, FolderReport):
        carried = f"{report.links} files hard-linked, {report.copies} copied"
        library = f"; library {report.library} copied in and named in genai_config.json" if report.library else ""
        print(f"wrote {where} ({carried}{library})")
    else:
        shared = ", ".join(f"{loc} ({how})" for loc, how in report.data_files.items())
        print(f"wrote {where}" + (f"; external data: {shared}" if shared else ""))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "library-path":
            print(library_path())
            return 0
        report = rewrite_path(args.input, args.output, args.include, args.exclude, args.library,
                              require_rewrite=True, pack=args.pack)
    except (RewriteError, OutputError, LibraryNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # permissions, full disk, ...: the system's message names the file
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print_report(report, args.pack)
    return 0


if __name__ == "__main__":
    sys.exit(main())
