"""Rewrite a model, a file or a genai folder onto our ops: com.microsoft MatMulNBits nodes onto
ort_mtp MatMulNBits, and linear-attention blocks (the Gated DeltaNet mixer's com.microsoft subgraph)
onto one ort_mtp GatedDeltaNet node each.

The rewrites are onnxscript rewriter rules on onnx-ir (ops.patterns, ops.linear_attention): a model
proto is viewed as an onnx-ir model without loading any external weight, the rules replace what
they match, and the proto is written back with every other node, initializer and external-data
reference as it was. A rewrite kind can be chosen with `rewrites` (`--only`): "matmul",
"linear-attention"; by default both run.

MatMulNBits: the two ops share attributes and inputs, so a swap only changes the node's domain: the
node keeps reading the same initializers, no weight byte is touched or copied. With pack=True
(`--pack`) the swapped nodes that the tiles layout takes (ops.packing: 4 bits, block 32/64/128,
K % 256 == 0, N % 16 == 0, no zero points, fp16/bf16) also get packing=1 and their B and scales
regrouped, written to a new `<model>.tiles.data` file; everything else is carried over as without it.
Models are loaded with load_external_data=False and written back with their external-data
references unchanged, so external weights stay where they are (a file written into its source's
folder shares them; one written elsewhere gets them by hard link, or by copy across file systems).

Linear attention: Transpose -> CausalConvWithState -> Transpose -> Split -> per-head L2 norms of q
and k -> q scale -> LinearAttentionGate -> LinearAttention -> GatedRMSNorm becomes one GatedDeltaNet
reading the same initializers (ops.linear_attention has the pattern and the attributes). A block
that does not fit (another update rule or activation, a value inside it read outside it, an
unsupported dtype, ...) is left as it was and reported with the reason; so is every block when the
custom-op library has no GatedDeltaNet kernel (file and folder rewrites ask it).

    import onnx, ops.rewrite
    model = onnx.load("model.onnx", load_external_data=False)
    ops.rewrite.rewrite_model(model, exclude="/lm_head/*")   # -> number of MatMulNBits nodes swapped
    report = ops.rewrite.rewrite_model_report(model)         # what was rewritten, what was kept and why
    ops.rewrite.rewrite_path("model_folder", "model_folder_ort_mtp")   # also: python -m ops rewrite IN OUT

Nodes our op cannot run (2-bit weights, g_idx, prepacked weights, ...) are left as com.microsoft
nodes and reported, so a rewritten model always runs. The node keeps its accuracy_level: on the CPU
EP, 4 (int8 activations, what the genai builder's CPU int4 exports ask for) runs our int8 kernel, as
ORT's CPU op does at that level, and 0..3 our float32 one; the CUDA kernels compute in float32 at
every level (README.md, the op reference).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from . import DOMAIN, MATMUL_NBITS, LibraryNotFoundError, library_path, packing, probe
from .kinds import (  # noqa: F401 (the kinds are also ops.rewrite's public names: ops.rewrite.REWRITES)
    ATTENTION,
    FLOAT_MATMUL,
    GATED_ATTENTION,
    LINEAR_ATTENTION,
    MATMUL,
    MLP,
    NORM,
    REWRITES,
    SOURCE_DOMAIN,
)
from .paths import inside_folder
from .progress import progress_bar
from .staging import check_output, staged_files, staged_folder

GENAI_CONFIG = "genai_config.json"
TILES_DATA_SUFFIX = ".tiles.data"  # <model file><suffix>: the weights --pack rewrote
GENAI_LIBRARY_KEY = "custom_ops_library"
"""onnxruntime-genai's session option naming a custom-op library (src/config.cpp). genai only loads
a library that lies inside the model folder, an EP's folder or the working directory, so the
library is copied into the output folder and named relative to it."""



class RewriteError(Exception):
    """A user-facing problem with the input or output (the CLI prints it as one line)."""


# --------------------------------------------------------------------------------------------------
# Node selection


class NodeFilter:
    """Which nodes to rewrite, by node name. A pattern is a glob (fnmatch, case-sensitive, `*`
    crosses `/`) or, prefixed with `re:`, a regular expression searched in the name. A node is
    rewritten when it matches some include pattern (no include patterns: every node) and no
    exclude pattern. Nodes without a name are matched by their first output's name. A
    linear-attention block is selected by the name of its LinearAttention node
    (`/model/layers.N/linear_attn/LinearAttention`)."""

    def __init__(self, include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None):
        self.include = _patterns(include, "include")
        self.exclude = _patterns(exclude, "exclude")
        self.matched: set[str] = set()  # pattern texts that matched at least one candidate node

    def selects(self, name: str) -> bool:
        hits_include = [text for text, match in self.include if match(name)]
        hits_exclude = [text for text, match in self.exclude if match(name)]
        self.matched.update(hits_include, hits_exclude)
        return (not self.include or bool(hits_include)) and not hits_exclude

    def unmatched(self) -> list[str]:
        """Patterns that matched no MatMulNBits node nor linear-attention block (likely typos)."""
        return [text for text, _ in self.include + self.exclude if text not in self.matched]


def _patterns(spec, what: str):
    if spec is None:
        return []
    texts = [spec] if isinstance(spec, str) else list(spec)
    compiled = []
    for text in texts:
        if not isinstance(text, str) or not text:
            raise RewriteError(f"{what} pattern must be a non-empty string, got {text!r}")
        if text.startswith("re:"):
            try:
                regex = re.compile(text[3:])
            except re.error as e:
                raise RewriteError(f"{what} pattern {text!r} is not a valid regular expression: {e}") from None
            compiled.append((text, lambda name, r=regex: r.search(name) is not None))
        else:
            compiled.append((text, lambda name, g=text: fnmatch.fnmatchcase(name, g)))
    return compiled


# --------------------------------------------------------------------------------------------------
# Model-level rewrite


@dataclass
class BlockReport:
    """What the linear-attention rewrite did to one model: blocks are named by their LinearAttention
    node."""

    rewritten: list[str] = field(default_factory=list)            # blocks now one GatedDeltaNet node
    kept: list[tuple[str, str]] = field(default_factory=list)     # (block, why it was left as it was)
    filtered_out: int = 0                                          # blocks the include/exclude patterns left alone

    @property
    def total(self) -> int:
        return len(self.rewritten) + len(self.kept) + self.filtered_out


@dataclass
class ModelReport:
    """What a rewrite did to one model. The first fields are the MatMulNBits rewrite's."""

    rewritten: list[str] = field(default_factory=list)           # node names
    unsupported: list[tuple[str, str]] = field(default_factory=list)  # (node name, why it was kept)
    filtered_out: int = 0                                         # MatMulNBits nodes the filter left alone
    packed: int = 0                                               # nodes put in the tiles layout (pack=True)
    not_packed: list[tuple[str, str]] = field(default_factory=list)  # (node name, why not), pack=True
    linear_attention: BlockReport = field(default_factory=BlockReport)
    attention: BlockReport = field(default_factory=BlockReport)  # GroupQueryAttention nodes, by name
    float_matmul: BlockReport = field(default_factory=BlockReport)  # ONNX MatMul nodes, by name
    float_matmul_merged: list[str] = field(default_factory=list)  # two-weight ort_mtp MatMul nodes made from pairs
    mlp: BlockReport = field(default_factory=BlockReport)  # gated MLPs fused into one node, by their Sigmoid
    gated_attention: BlockReport = field(default_factory=BlockReport)  # attention mixers in one node, by their GQA
    norm: BlockReport = field(default_factory=BlockReport)  # SkipSimplifiedLayerNormalization nodes, by name

    @property
    def count(self) -> int:
        """MatMulNBits nodes swapped."""
        return len(self.rewritten)

    @property
    def changed(self) -> bool:
        """Whether anything was rewritten (a MatMulNBits node, a linear-attention block, an attention node,
        a MatMul node)."""
        return bool(self.rewritten or self.linear_attention.rewritten or self.attention.rewritten
                    or self.float_matmul.rewritten or self.mlp.rewritten or self.gated_attention.rewritten
                    or self.norm.rewritten)


def rewrite_model(model: onnx.ModelProto, include=None, exclude=None, rewrites=None) -> int:
    """Rewrites the model in place (rewrite_model_report); returns the number of MatMulNBits nodes
    swapped."""
    return rewrite_model_report(model, NodeFilter(include, exclude), rewrites).count


def _rewrite_kinds(rewrites) -> tuple[str, ...]:
    if rewrites is None:
        return REWRITES
    kinds = (rewrites,) if isinstance(rewrites, str) else tuple(rewrites)
    for kind in kinds:
        if kind not in REWRITES:
            raise RewriteError(f"unknown rewrite {kind!r} (one of: {', '.join(REWRITES)})")
    return kinds


def rewrite_model_report(model: onnx.ModelProto, node_filter: NodeFilter | None = None, rewrites=None,
                         gated_delta_net=None, base_dir=None, attention=None, float_matmul=None,
                         mlp=None, gated_attention=None, norm=None) -> ModelReport:
    """Rewrites, in place, in the main graph, its subgraphs and the model's functions: the
    com.microsoft MatMulNBits nodes and the linear-attention blocks selected by node_filter (see
    NodeFilter; a block is selected by its LinearAttention node's name). `rewrites`: which kinds run
    (REWRITES, default all). `gated_delta_net(signature) -> None | reason`, if given, says whether
    the GatedDeltaNet op can run a block's types (ops.linear_attention.available); without it the
    linear-attention rewrite is structural only; `attention(dtype) -> None | reason` likewise for
    GroupQueryAttention nodes (ops.attention.available), `float_matmul(dtype) -> None | reason` for
    ONNX MatMul nodes (ops.float_matmul.available), `mlp(dtype) -> None | reason` for gated MLPs
    (ops.mlp.available; the mlp kind runs after the matmul one, on ort_mtp MatMulNBits nodes),
    `gated_attention(dtype) -> None | reason` for attention mixers (ops.gated_attention.available; after the
    attention kind, on ort_mtp GroupQueryAttention nodes), `norm(dtype) -> None | reason` for
    SkipSimplifiedLayerNormalization nodes (ops.norm.available). `base_dir`: the model's folder, where small
    constants stored as external data are read from (no large initializer is read). Adds the
    ort_mtp opset import where it rewrote a node. The proto is not touched when nothing is
    rewritten; otherwise every node, initializer, external reference and value_info that is not
    part of a rewritten node stays as it was."""
    node_filter = node_filter or NodeFilter()
    kinds = _rewrite_kinds(rewrites)
    report = ModelReport()
    wanted = {(SOURCE_DOMAIN, MATMUL_NBITS)} if MATMUL in kinds else set()
    if LINEAR_ATTENTION in kinds:
        wanted.add((SOURCE_DOMAIN, "LinearAttention"))
    if ATTENTION in kinds:
        wanted.add((SOURCE_DOMAIN, "GroupQueryAttention"))
    if FLOAT_MATMUL in kinds:
        wanted |= {("", "MatMul"), ("ai.onnx", "MatMul")}
    if MLP in kinds:
        wanted |= {(SOURCE_DOMAIN, MATMUL_NBITS), (DOMAIN, MATMUL_NBITS)}
    if GATED_ATTENTION in kinds:
        wanted |= {(SOURCE_DOMAIN, "GroupQueryAttention"), (DOMAIN, "GroupQueryAttention")}
    if NORM in kinds:
        wanted.add((SOURCE_DOMAIN, "SkipSimplifiedLayerNormalization"))
    if not any((n.domain, n.op_type) in wanted for _, nodes in _node_lists(model) for n in nodes):
        return report  # nothing to look at: no onnx-ir view of the model is built

    import onnx_ir as ir

    from . import patterns
    from .linear_attention import LinearAttentionRewrite

    try:
        view = ir.serde.deserialize_model(model)
    except ir.serde.SerdeError as e:
        raise RewriteError(f"the model is not a valid ONNX graph ({_innermost(e)})") from None
    if base_dir is not None:
        ir.external_data.set_base_dir(view.graph, str(base_dir))
    if MATMUL in kinds:
        outcome = patterns.apply(view, patterns.MatMulNBitsRewrite(), node_filter.selects)
        report.rewritten, report.unsupported, report.filtered_out = outcome.rewritten, outcome.kept, outcome.filtered_out

    def blocks(rewrite) -> BlockReport:
        outcome = patterns.apply(view, rewrite, node_filter.selects)
        return BlockReport(outcome.rewritten, outcome.kept, outcome.filtered_out)

    if LINEAR_ATTENTION in kinds:
        report.linear_attention = blocks(LinearAttentionRewrite(gated_delta_net))
    if ATTENTION in kinds:
        from .attention import AttentionRewrite

        report.attention = blocks(AttentionRewrite(attention))
    if FLOAT_MATMUL in kinds:
        from .float_matmul import FloatMatMulRewrite, merge_shared_inputs

        report.float_matmul = blocks(FloatMatMulRewrite(float_matmul))
        if report.float_matmul.rewritten:  # pairs reading one A: one launch (ops.float_matmul.merge_shared_inputs)
            report.float_matmul_merged = merge_shared_inputs(view)
    if MLP in kinds:
        from .mlp import MlpRewrite

        report.mlp = blocks(MlpRewrite(mlp))
    if GATED_ATTENTION in kinds:
        from .gated_attention import GatedAttentionRewrite

        report.gated_attention = blocks(GatedAttentionRewrite(gated_attention))
    if NORM in kinds:
        from . import norm as norm_rewrite

        outcome = norm_rewrite.rewrite(view, norm, node_filter.selects)
        report.norm = BlockReport(outcome.rewritten, outcome.kept, outcome.filtered_out)
    if report.changed:
        try:
            rewritten = ir.serde.serialize_model(view)
        except ir.serde.SerdeError as e:  # what onnx-ir read but cannot write back: an attribute of no type, say
            raise RewriteError(f"the model is not a valid ONNX graph ({_innermost(e)})") from None
        _keep_value_info(model, rewritten)
        model.CopyFrom(rewritten)
    return report


def _innermost(error: BaseException) -> str:
    """The first cause of onnx-ir's chain of SerdeErrors (each names only the object it was in): what
    was wrong, such as "Unsupported attribute type: UNDEFINED"."""
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {error}"[:300]


def _keep_value_info(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> None:
    """onnx-ir writes a value_info entry for every value whose type it knows, initializers included;
    the rewritten proto keeps only the entries the original had (a rewritten node's outputs keep
    their names, so theirs stay), so the graph does not grow by entries nobody asked for."""
    names = {vi.name for g in _graphs(original.graph) for vi in g.value_info}
    names |= {vi.name for f in original.functions for vi in f.value_info}
    owners = list(_graphs(rewritten.graph)) + list(rewritten.functions)
    for owner in owners:
        keep = [vi for vi in owner.value_info if vi.name in names]
        if len(keep) != len(owner.value_info):
            del owner.value_info[:]
            owner.value_info.extend(keep)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """graph and every subgraph inside it (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        yield from _subgraphs(node)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield from _graphs(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for g in attr.graphs:
                yield from _graphs(g)


def _node_lists(model: onnx.ModelProto):
    """(owning function or None, node list) for every graph and function body of the model."""
    for g in _graphs(model.graph):
        yield None, g.node
    for function in model.functions:
        yield function, function.node
        for node in function.node:
            for g in _subgraphs(node):
                yield function, g.node


# --------------------------------------------------------------------------------------------------
# External data


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """Relative locations of every external-data file the model references, sorted."""
    locations = set()
    for t in _tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return sorted(locations)


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    graphs = list(_graphs(model.graph))
    for function in model.functions:
        for node in function.node:
            graphs.extend(_subgraphs(node))
    for g in graphs:
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield sparse.values
            yield sparse.indices
    nodes = [n for g in graphs for n in g.node] + [n for f in model.functions for n in f.node]
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


def _safe_relative(location: str, owner: Path, what: str = "external data location") -> Path:
    if not inside_folder(location):
        raise RewriteError(f"{owner}: {what} {location!r} is not a path inside its folder")
    return Path(location)


def link_or_copy(src: Path, dst: Path) -> str:
    """Hard-links src to dst, or copies it when a link is impossible (another file system, or a
    file system without hard links). Returns "link" or "copy"."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copy2(src, dst)
        return "copy"


# --------------------------------------------------------------------------------------------------
# File-level rewrite


@dataclass
class FileReport:
    """What rewrite_file did."""

    source: Path
    output: Path
    model: ModelReport
    data_files: dict[str, str] = field(default_factory=dict)  # location -> "shared", "link" or "copy"
    unmatched_patterns: list[str] = field(default_factory=list)  # include/exclude patterns that matched no node


def load_model(path: Path) -> onnx.ModelProto:
    """The model's graph, without loading any external weight."""
    if not path.is_file():
        raise RewriteError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path), format="protobuf", load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise RewriteError(f"{path} is not an ONNX model ({type(e).__name__}: {e})") from None
    # protobuf parses many non-model byte strings (an empty file, some text) without complaint
    if not model.ir_version or not model.HasField("graph"):
        raise RewriteError(f"{path} is not an ONNX model (no IR version or graph)")
    damaged = damaged_text(model, path)
    if damaged:
        raise RewriteError(damaged)
    return model


def damaged_text(model: onnx.ModelProto, path: Path) -> str | None:
    """What is wrong, as one line naming `path`, where a string field of the model holds bytes that are
    not UTF-8 (a damaged file: protobuf's Python runtime then hands over bytes where a name is read as
    text); None where every one is text. The driver's loader and load_model both check this."""
    field = non_text_field(model)
    return f"{path} is not a valid ONNX model (its {field} is not UTF-8 text: a damaged file?)" if field else None


def non_text_field(message, where: str = "") -> str | None:
    """The first string field (a name, an op type, a location...) that holds bytes which are not UTF-8,
    or None. Bytes fields (raw tensor data, string attributes) are not text and not read; every other
    message of the graph is visited, so the time grows with the nodes, not with external weights."""
    for descriptor, value in message.ListFields():
        if descriptor.type == descriptor.TYPE_BYTES:
            continue
        name = f"{where}.{descriptor.name}" if where else descriptor.name
        values = value if descriptor.is_repeated else [value]
        if descriptor.type == descriptor.TYPE_STRING:
            if any(not isinstance(v, str) for v in values):
                return name
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            for v in values:
                found = non_text_field(v, name)
                if found:
                    return found
    return None


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Writes the model proto as it is: external-data references are kept, no tensor is moved."""
    try:
        data = model.SerializeToString()
    except ValueError as e:  # protobuf's 2 GB limit, only reachable with weights inside the model
        raise RewriteError(f"{path}: model is too large to serialise ({e}); store its weights as external data") from None
    path.write_bytes(data)


def _tiles_data(model_file: Path) -> Path:
    """Where --pack writes the packed weights of the model written to model_file."""
    return model_file.parent / f"{model_file.name}{TILES_DATA_SUFFIX}"


def _pack(model: onnx.ModelProto, report: ModelReport, source: Path, output: Path) -> None:
    """pack=True: the swapped nodes the tiles layout takes get packed weights (ops.packing), read
    from the model file `source`'s folder. Those stored as external data are written to a new file
    next to `output` (where the model is written), `<output name>.tiles.data`; the original data
    files are carried over as usual (other tensors may still need them). Where stderr is a terminal,
    a bar there counts the nodes (ops.progress)."""
    try:
        external = packing.ExternalWeights(source.parent, _tiles_data(output))
        nodes = len(packing.our_matmul_nodes(model))
        with progress_bar(f"packing {source.name}", total=nodes, unit="node") as bar:
            report.packed, report.not_packed = packing.pack_model(model, external, on_node=bar.update)
    except (ValueError, OSError) as e:  # the message names the node, the initializer and its data file
        raise RewriteError(f"cannot pack {source}: {e}") from None


def _library_check(available, op: str, library, provider: str, device_id: int):
    """check(signature) -> None | why: whether `library` (default: ops.library_path(), looked up only
    when asked) runs ort_mtp::`op` on `provider` for a node's signature, by `available(path, provider,
    signature, device_id)`."""

    def check(signature) -> str | None:
        try:
            path = str(library) if library else library_path()
        except LibraryNotFoundError as e:
            return f"no custom-op library to run ort_mtp::{op} ({e})"
        return available(path, provider, signature, device_id)

    return check


def gated_delta_net_check(library: str | os.PathLike | None = None, provider: str = "cpu", device_id: int = 0):
    """The `gated_delta_net` argument of rewrite_model_report for a model that will run with
    `library` (default: ops.library_path()) on `provider`: a block is rewritten only where the
    library's GatedDeltaNet kernel takes its types there."""
    from . import linear_attention

    return _library_check(linear_attention.available, "GatedDeltaNet", library, provider, device_id)


def attention_check(library: str | os.PathLike | None = None, provider: str = "cpu", device_id: int = 0):
    """The `attention` argument of rewrite_model_report: a GroupQueryAttention node is rewritten only
    where `library` runs ort_mtp::GroupQueryAttention for its type on `provider`."""
    from . import attention

    return _library_check(attention.available, "GroupQueryAttention", library, provider, device_id)


def gated_attention_check(library: str | os.PathLike | None = None, provider: str = "cpu", device_id: int = 0):
    """The `gated_attention` argument of rewrite_model_report: an attention mixer is fused only where
    `library` runs ort_mtp::GatedAttention for its type on `provider`."""
    from . import gated_attention

    return _library_check(gated_attention.available, "GatedAttention", library, provider, device_id)


def mlp_check(library: str | os.PathLike | None = None, provider: str = "cpu", device_id: int = 0):
    """The `mlp` argument of rewrite_model_report: a gated MLP is fused only where `library` runs
    ort_mtp::MatMulNBits' swiglu form for its type on `provider`."""
    from . import mlp

    return _library_check(mlp.available, "MatMulNBits (activation=swiglu)", library, provider, device_id)


def norm_check(library: str | os.PathLike | None = None, provider: str = "cpu", device_id: int = 0):
    """The `norm` argument of rewrite_model_report: a SkipSimplifiedLayerNormalization node is rewritten
    only where `library` runs ours for its type on `provider`."""
    from . import norm

    return _library_check(norm.available, "SkipSimplifiedLayerNormalization", library, provider, device_id)


def float_matmul_check(library: str | os.PathLike | None = None, provider: str = "cpu", device_id: int = 0):
    """The `float_matmul` argument of rewrite_model_report: a MatMul node is rewritten only where
    `library` runs ort_mtp::MatMul for its type on `provider`."""
    from . import float_matmul

    return _library_check(float_matmul.available, "MatMul", library, provider, device_id)


def rewrite_file(source, output, include=None, exclude=None, require_rewrite: bool = False,
                 pack: bool = False, rewrites=None) -> FileReport:
    """Rewrites one .onnx file into `output` (a new file, or a new file inside an empty existing
    folder). External data files are shared when output lies in the source's folder, otherwise
    hard-linked (or copied) next to the output under the same relative names. require_rewrite:
    raise when no node was swapped. pack: also put the weights of the nodes the tiles layout takes
    into it (packing=1; see _pack). rewrites: which kinds run (REWRITES, default all); a
    linear-attention block is rewritten only if the installed library (ops.library_path()) runs
    GatedDeltaNet for its types on the CPU EP. Raises ops.staging.OutputError for a symbolic-link
    output; an error or interrupt leaves no file behind."""
    source, output = Path(source), Path(output)
    model = load_model(source)
    check_output(output)
    if output.is_dir():
        if any(output.iterdir()):
            raise RewriteError(f"{output} exists and is not empty")
        output = output / source.name
    elif output.exists():
        raise RewriteError(f"{output} already exists")
    if not output.parent.is_dir():
        raise RewriteError(f"{output.parent}: no such folder")

    node_filter = NodeFilter(include, exclude)
    report = FileReport(source, output, rewrite_model_report(
        model, node_filter, rewrites, gated_delta_net_check(), base_dir=source.parent, attention=attention_check(),
        float_matmul=float_matmul_check(), mlp=mlp_check(), gated_attention=gated_attention_check(),
        norm=norm_check()))
    report.unmatched_patterns = node_filter.unmatched()
    if require_rewrite and not report.model.changed and not (pack and _has_our_nodes(model)):
        raise RewriteError(_nothing_rewritten(source, report.model, _rewrite_kinds(rewrites)))

    same_folder = output.parent.resolve() == source.parent.resolve()
    plan = []
    for location in external_data_files(model):
        rel = _safe_relative(location, source)
        src_file = source.parent / rel
        if not src_file.is_file():
            raise RewriteError(f"{source}: external data file {src_file} is missing")
        dst_file = output.parent / rel
        if same_folder or (dst_file.exists() and dst_file.samefile(src_file)):
            report.data_files[location] = "shared"
        elif os.path.lexists(dst_file):  # a dangling link too: never written through
            raise RewriteError(f"{dst_file} exists and is not {src_file}, which {source.name} needs there")
        else:
            plan.append((location, src_file, rel))
    if pack:  # a new file: neither the output's folder nor the source's (its data files come along) may hold one
        for taken in (_tiles_data(output), _tiles_data(source.parent / output.name)):
            if os.path.lexists(taken):
                raise RewriteError(f"{taken} exists; {taken.name} is the name --pack writes the packed weights to")
    # Every new file is written in a staging folder and moved next to the output when all are
    # complete, the model last: a failed or interrupted rewrite leaves nothing behind.
    with staged_files(output.parent, last=output.name) as staging:
        for location, src_file, rel in plan:
            report.data_files[location] = link_or_copy(src_file, staging / rel)
        if pack:
            _pack(model, report.model, source, staging / output.name)
        save_model(model, staging / output.name)
    return report


# --------------------------------------------------------------------------------------------------
# Folder-level rewrite (onnxruntime-genai model folders)


@dataclass
class FolderReport:
    """What rewrite_folder did."""

    source: Path
    output: Path
    models: dict[str, ModelReport] = field(default_factory=dict)  # model file -> its report
    library: str | None = None   # library file name inside output (None: nothing was rewritten)
    links: int = 0               # files carried over by hard link
    copies: int = 0              # files carried over by copy
    unmatched_patterns: list[str] = field(default_factory=list)  # include/exclude patterns that matched no node

    @property
    def count(self) -> int:
        return sum(r.count for r in self.models.values())


def genai_model_sections(config: dict) -> list[tuple[str, dict]]:
    """(dotted path, section) of every section of a genai_config that names an .onnx model in its
    "filename" (model.decoder, model.mtp, model.vision, pipeline stages, ...)."""
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            filename = node.get("filename")
            if isinstance(filename, str) and filename.endswith(".onnx"):
                found.append((path, node))
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(config, "")
    return found


def _session_options_for(section: dict, config: dict) -> dict:
    """The session options genai uses for a section's model: its own, else the decoder's (genai's
    fallback for sections without session_options)."""
    if isinstance(section.get("session_options"), dict):
        return section["session_options"]
    decoder = config.get("model", {}).get("decoder")
    owner = decoder if isinstance(decoder, dict) else section  # no decoder: nothing to fall back to
    if not isinstance(owner.get("session_options"), dict):
        owner["session_options"] = {}
    return owner["session_options"]


def _section_provider(section: dict, config: dict) -> tuple[str, int]:
    """The execution provider (and device id) genai runs a section's model on: the first entry of
    its session options' provider_options (the decoder's for a section without session options),
    "cpu" when there is none. Reads the config without changing it."""
    options = section.get("session_options")
    if not isinstance(options, dict):
        decoder = config.get("model", {}).get("decoder")
        options = decoder.get("session_options") if isinstance(decoder, dict) else None
    providers = options.get("provider_options") if isinstance(options, dict) else None
    for entry in providers if isinstance(providers, list) else []:
        if isinstance(entry, dict) and entry:
            name, settings = next(iter(entry.items()))
            device = settings.get("device_id", 0) if isinstance(settings, dict) else 0
            try:
                return str(name).lower(), int(device)
            except (TypeError, ValueError):
                return str(name).lower(), 0
    return "cpu", 0


def rewrite_folder(source, output, include=None, exclude=None, library: str | None = None,
                   require_rewrite: bool = False, pack: bool = False, rewrites=None) -> FolderReport:
    """Rewrites every model a genai_config.json names into a new folder `output` (absent or empty)
    and carries every other file over (hard link, else copy; weights are never rewritten). The
    library (default: ops.library_path()) is copied into `output` and named in the session options
    of each rewritten model, so onnxruntime-genai loads the folder as it is. require_rewrite:
    raise when no node was swapped. pack: also put the weights of the nodes the tiles layout takes
    into it (packing=1; see _pack). rewrites: which kinds run (REWRITES, default all); a
    linear-attention block is rewritten only if the library copied in runs GatedDeltaNet for its
    types on the EP genai_config.json names for the model (its CUDA kernel for a CUDA folder, which
    needs a GPU here to be asked). Raises ops.staging.OutputError for an output that is a symbolic link, the
    source folder or inside it; an error or interrupt leaves no `output` behind."""
    source, output = Path(source), Path(output)
    config_path = source / GENAI_CONFIG
    if not source.is_dir():
        raise RewriteError(f"{source}: no such folder")
    if not config_path.is_file():
        raise RewriteError(f"{source} is not an onnxruntime-genai model folder (no {GENAI_CONFIG})")
    check_output(output, source)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise RewriteError(f"{output} exists and is not an empty folder")
    if library is not None:  # before any work: the folder would name a library onnxruntime-genai cannot load
        _check_library(Path(library))
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RewriteError(f"{config_path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise RewriteError(f"{config_path} is not a genai config (its top level is not a JSON object)")
    sections = genai_model_sections(config)
    if not sections:
        raise RewriteError(f"{config_path} names no .onnx model")

    node_filter = NodeFilter(include, exclude)
    kinds = _rewrite_kinds(rewrites)
    report = FolderReport(source, output)
    rewritten: dict[str, onnx.ModelProto] = {}
    model_paths: dict[str, Path] = {}
    for section_path, section in sections:
        name = section["filename"]
        if name in report.models:
            continue  # two sections naming one file
        model_path = model_paths[name] = source / _safe_relative(name, config_path, f"{section_path}.filename")
        model = load_model(model_path)
        for location in external_data_files(model):
            data = model_path.parent / _safe_relative(location, model_path)
            if not data.is_file():
                raise RewriteError(f"{model_path}: external data file {data} is missing")
        provider, device_id = _section_provider(section, config)
        report.models[name] = rewrite_model_report(model, node_filter, kinds,
                                                   gated_delta_net_check(library, provider, device_id),
                                                   base_dir=model_path.parent,
                                                   attention=attention_check(library, provider, device_id),
                                                   float_matmul=float_matmul_check(library, provider, device_id),
                                                   mlp=mlp_check(library, provider, device_id),
                                                   gated_attention=gated_attention_check(library, provider, device_id),
                                                   norm=norm_check(library, provider, device_id))
        if report.models[name].changed or (pack and _has_our_nodes(model)):
            rewritten[name] = model  # with pack, a model already on our op is rewritten too
    report.unmatched_patterns = node_filter.unmatched()
    if require_rewrite and not rewritten:
        merged = ModelReport()
        for r in report.models.values():
            merged.unsupported += r.unsupported
            merged.filtered_out += r.filtered_out
            merged.linear_attention.kept += r.linear_attention.kept
            merged.linear_attention.filtered_out += r.linear_attention.filtered_out
            merged.attention.kept += r.attention.kept
            merged.attention.filtered_out += r.attention.filtered_out
            merged.float_matmul.kept += r.float_matmul.kept
            merged.float_matmul.filtered_out += r.float_matmul.filtered_out
            merged.mlp.kept += r.mlp.kept
            merged.mlp.filtered_out += r.mlp.filtered_out
            merged.gated_attention.kept += r.gated_attention.kept
            merged.gated_attention.filtered_out += r.gated_attention.filtered_out
            merged.norm.kept += r.norm.kept
            merged.norm.filtered_out += r.norm.filtered_out
        raise RewriteError(_nothing_rewritten(source, merged, kinds))

    lib_src = Path(library) if library else Path(library_path())
    if rewritten:
        if library is None:  # an explicit one was checked before any work
            _check_library(lib_src)
        report.library = lib_src.name
        for section_path, section in sections:
            if section["filename"] not in rewritten:
                continue
            options = _session_options_for(section, config)
            current = options.get(GENAI_LIBRARY_KEY)
            if current not in (None, report.library):
                raise RewriteError(
                    f"{config_path}: {section_path} already loads custom-op library {current!r}; "
                    "onnxruntime-genai loads one library per session")
            options[GENAI_LIBRARY_KEY] = report.library

    if pack:  # the packed weights' files are new files too: none may come over from the source
        for name in rewritten:
            taken = _tiles_data(source / name)
            if taken.exists():
                raise RewriteError(f"{taken} exists; {taken.name} is the name --pack writes {name}'s packed weights to")
    # Written in a staging folder renamed to `output` when complete: a failed or interrupted rewrite
    # leaves no half folder (that a rerun would refuse as not empty).
    written = {GENAI_CONFIG, *rewritten}
    if report.library:
        written.add(report.library)
    with staged_folder(output) as staging:
        _carry_over(source, staging, written, report)
        for name, model in rewritten.items():
            if pack:
                _pack(model, report.models[name], model_paths[name], staging / name)
            save_model(model, staging / name)
        if report.library:
            shutil.copy2(lib_src, staging / report.library)
        (staging / GENAI_CONFIG).write_text(json.dumps(config, indent=4) + "\n")
    return report


def _carry_over(source: Path, output: Path, written: set[str], report: FolderReport) -> None:
    """Hard-links (or copies) every file of `source` but those in `written` (relative paths) into
    `output`. Files written instead (config, rewritten models, the library, packed weights) are new
    files, never written through a link into the source folder."""
    for path in sorted(source.rglob("*")):
        if path.is_dir():
            continue
        rel = path.relative_to(source).as_posix()
        if rel in written:
            continue
        if link_or_copy(path.resolve(), output / rel) == "link":
            report.links += 1
        else:
            report.copies += 1


def _check_library(path: Path) -> None:
    """Raises RewriteError unless `path` is a file ONNX Runtime loads as a custom-op library."""
    if not path.is_file():
        raise RewriteError(f"custom-op library {path} does not exist" if not path.exists()
                           else f"custom-op library {path} is not a file")
    why = probe.unusable(path)
    if why:
        raise RewriteError(why)


def rewrite_path(source, output, include=None, exclude=None, library: str | None = None,
                 require_rewrite: bool = False, pack: bool = False, rewrites=None):
    """rewrite_folder for a folder, rewrite_file for a file."""
    source = Path(source)
    if source.is_dir():
        return rewrite_folder(source, output, include, exclude, library, require_rewrite, pack, rewrites)
    if source.is_file():
        return rewrite_file(source, output, include, exclude, require_rewrite, pack, rewrites)
    raise RewriteError(f"{source}: no such file or folder")


def _has_our_nodes(model: onnx.ModelProto) -> bool:
    """Whether the main graph has ort_mtp MatMulNBits nodes (what --pack can pack)."""
    return any(n.domain == DOMAIN and n.op_type == MATMUL_NBITS for n in model.graph.node)


def _none_rewritten(blocks: BlockReport, what: str) -> str:
    """Why none of a model's `what` (its blocks or nodes of one kind, blocks.total > 0) was rewritten."""
    if blocks.kept:
        name, why = blocks.kept[0]
        return f"none of its {blocks.total} {what} can be rewritten ({len(blocks.kept)} kept, e.g. {name!r}: {why})"
    return f"the include/exclude patterns select none of its {blocks.total} {what}"


# The rewrites run alone whose candidates are one BlockReport: its ModelReport field, what the candidates
# are, and what a model without any lacks.
_SINGLE_KIND_WORDS = {
    ATTENTION: ("attention", "GroupQueryAttention nodes", "has no com.microsoft GroupQueryAttention node"),
    FLOAT_MATMUL: ("float_matmul", "MatMul nodes", "has no MatMul node"),
    MLP: ("mlp", "gated MLPs",
          "has no gated MLP on ort_mtp MatMulNBits nodes (the mlp rewrite runs after the matmul one)"),
    GATED_ATTENTION: ("gated_attention", "attention mixers",
                      "has no ort_mtp GroupQueryAttention node (the gated-attention rewrite runs after the attention one)"),
    NORM: ("norm", "SkipSimplifiedLayerNormalization nodes", "has no com.microsoft SkipSimplifiedLayerNormalization node"),
}


def _nothing_rewritten(source: Path, report: ModelReport, kinds=REWRITES) -> str:
    if len(kinds) == 1 and kinds[0] in _SINGLE_KIND_WORDS:
        field_name, what, lacks = _SINGLE_KIND_WORDS[kinds[0]]
        blocks = getattr(report, field_name)
        return f"{source}: {_none_rewritten(blocks, what)}" if blocks.total else f"{source} {lacks}"
    kinds = tuple(k for k in kinds if k not in _SINGLE_KIND_WORDS)  # the messages below are about the other kinds
    blocks = report.linear_attention
    if MATMUL not in kinds and not blocks.total:
        return f"{source} has no linear-attention block (com.microsoft LinearAttention node)"
    if blocks.total:
        matmuls = len(report.unsupported) + report.filtered_out
        la = _none_rewritten(blocks, "linear-attention blocks")
        if MATMUL not in kinds:
            return f"{source}: {la}"
        if report.unsupported:
            name, why = report.unsupported[0]
            return (f"{source}: {la}, and no MatMulNBits node can be rewritten ({len(report.unsupported)} "
                    f"unsupported, e.g. {name!r}: {why})")
        if report.filtered_out:
            return f"{source}: {la}, and the patterns select none of its {matmuls} MatMulNBits nodes"
        return f"{source}: {la}, and it has no com.microsoft MatMulNBits node"
    if report.unsupported:
        name, why = report.unsupported[0]
        return (f"{source}: no MatMulNBits node can be rewritten ({len(report.unsupported)} unsupported, "
                f"e.g. {name!r}: {why})")
    if report.filtered_out:
        return f"{source}: the include/exclude patterns select none of its {report.filtered_out} MatMulNBits nodes"
    return f"{source} has no com.microsoft MatMulNBits node"
