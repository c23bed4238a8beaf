"""The tiles layout of ort_mtp::MatMulNBits (attribute packing=1): B and scales regrouped once, in numpy,
for the CUDA tensor-core kernel that reads them (csrc/matmul_nbits/gemv_tiles.cuh; the byte map is
documented with WeightLayout in csrc/matmul_nbits/matmul_nbits.h).

Per tile-chunk (16 weight rows x 256 k, tiles in row order, chunks in k order within a tile): 2048
bytes of B in the order a warp's lanes feed the mma, nibbles interleaved (k 0,2,4,6,1,3,5,7 within a
word), and the 16 rows' scales of the chunk. The tensors keep their shapes ([N, k_blocks,
block_bytes] and [N, k_blocks]); only the order of their bytes and elements changes. The CPU kernel
reads the layout too, so a packed model gives the same outputs on either execution provider.

    import ops.packing
    count, skipped = ops.packing.pack_model(model)   # ort_mtp MatMulNBits nodes with loaded weights

Requirements (tiles_unsupported_reason): 4 bits, block_size 32/64/128, K % 256 == 0, N % 16 == 0, no
zero points, float16 or bfloat16 activations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, helper

from . import DOMAIN, MATMUL_NBITS
from .paths import inside_folder

TILE_ROWS = 16
TILE_K = 256
PACKING_ATTRIBUTE = "packing"
TILES = 1
_NIBBLE_FROM = (0, 2, 4, 6, 1, 3, 5, 7)  # packed nibble i holds the word's k-th element _NIBBLE_FROM[i]
_TILE_TYPES = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def tiles_unsupported_reason(K: int, N: int, bits: int, block_size: int, float_type: int | None = None,
                             zero_points: bool = False) -> str | None:
    """Why weights of this shape cannot take the tiles layout, or None. float_type: A's ONNX element
    type when known."""
    if bits != 4:
        return f"bits={bits} (tiles need 4)"
    if block_size not in (32, 64, 128):
        return f"block_size={block_size} (tiles need 32, 64 or 128)"
    if K % TILE_K:
        return f"K={K} is not a multiple of {TILE_K}"
    if N % TILE_ROWS:
        return f"N={N} is not a multiple of {TILE_ROWS}"
    if zero_points:
        return "zero points (tiles take symmetric weights only)"
    if float_type is not None and float_type not in _TILE_TYPES:
        return f"{onnx.TensorProto.DataType.Name(float_type).lower()} activations (tiles need float16 or bfloat16)"
    return None


def _check(K: int, N: int, block_size: int = 32) -> None:
    reason = tiles_unsupported_reason(K, N, 4, block_size)
    if reason:
        raise ValueError(f"cannot use the tiles layout: {reason}")


def _words(b: np.ndarray, N: int, K: int) -> np.ndarray:
    raw = np.ascontiguousarray(b, dtype=np.uint8).reshape(N, K // 2)
    return raw.view("<u4")  # [N, K / 8]: word i = k 8i .. 8i + 7, element e in bits 4e .. 4e + 3


def _permute_nibbles(words: np.ndarray, to_tiles: bool) -> np.ndarray:
    out = np.zeros_like(words)
    for i, e in enumerate(_NIBBLE_FROM):
        src, dst = (e, i) if to_tiles else (i, e)
        out |= ((words >> np.uint32(4 * src)) & np.uint32(0xF)) << np.uint32(4 * dst)
    return out


# Axes of a row-major word array seen as [T, h, g, C, uh, w, t] (row 16 T + 8 h + g, word 32 C + 4 (4 uh + w)
# + t) and their order in the tiles layout [T, C, uh, h, g, t, w] (j = 2 uh + h, lane = 4 g + t).
_TO_TILES = (0, 3, 4, 1, 2, 6, 5)


def pack_b(b: np.ndarray, N: int, K: int) -> np.ndarray:
    """B ([N, k_blocks, block_bytes] uint8, or any shape with those N * K / 2 bytes) in the tiles
    layout, same shape."""
    _check(K, N)
    T, C = N // TILE_ROWS, K // TILE_K
    words = _words(b, N, K).reshape(T, 2, 8, C, 2, 4, 4)
    tiled = _permute_nibbles(np.ascontiguousarray(words.transpose(_TO_TILES)), to_tiles=True)
    return tiled.reshape(-1).view(np.uint8).reshape(np.shape(b))


def pack_tiles(N: int, K: int, block_size: int, b: np.ndarray | None = None, scales: np.ndarray | None = None,
               out_b: np.ndarray | None = None, out_scales: np.ndarray | None = None,
               threads: int = 0) -> tuple[np.ndarray | None, np.ndarray | None]:
    """pack_b(b) and pack_scales(scales) by the op library's packer (OrtMtpPackTiles,
    csrc/matmul_nbits/tiles_pack.cc): the same bytes in one pass over them, on `threads` threads (0:
    one per core), instead of numpy's several. b: N * K / 2 bytes; scales: N * K / block_size 16-bit
    values (float16 or the raw bits of bfloat16, as uint16); either may be None. out_b / out_scales:
    where to write (e.g. slices of a memory-mapped file), each C-contiguous and of its source's size;
    new arrays of the sources' shapes otherwise. Returns (packed B, packed scales)."""
    _check(K, N, block_size)
    args, results = [], []
    for src, out, count, dtype in ((b, out_b, N * K // 2, np.uint8), (scales, out_scales, N * K // block_size, np.uint16)):
        if src is None:
            args += [None, None]
            results.append(None)
            continue
        src = np.ascontiguousarray(src)
        if src.size != count or src.itemsize != np.dtype(dtype).itemsize:
            raise ValueError(f"has {src.size} values of {src.itemsize} bytes where N={N}, K={K}, "
                             f"block_size={block_size} need {count} of {np.dtype(dtype).itemsize}")
        if out is None:
            out = np.empty_like(src)
        elif out.size != count or out.itemsize != src.itemsize or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"the output must be a writeable C-contiguous array of {count} values like its source")
        args += [src.ctypes.data, out.ctypes.data]
        results.append(out)
    if _native_packer()(args[0], args[2], args[1], args[3], N, K, block_size, threads) != 0:
        raise ValueError(f"the library's packer refused N={N}, K={K}, block_size={block_size}")
    return results[0], results[1]


def _native_packer():
    """The library's OrtMtpPackTiles, through ctypes."""
    import ctypes

    from . import library_function

    return library_function("OrtMtpPackTiles", ctypes.c_int, [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int])


def unpack_b(packed: np.ndarray, N: int, K: int) -> np.ndarray:
    """The inverse of pack_b."""
    _check(K, N)
    T, C = N // TILE_ROWS, K // TILE_K
    words = _permute_nibbles(_words(packed, N, K).reshape(T, C, 2, 2, 8, 4, 4), to_tiles=False)
    back = np.argsort(_TO_TILES)
    return np.ascontiguousarray(words.transpose(back)).reshape(-1).view(np.uint8).reshape(np.shape(packed))


def pack_scales(scales: np.ndarray, N: int, K: int, block_size: int) -> np.ndarray:
    """Scales ([N, k_blocks], any element type) in the tiles layout, same shape."""
    _check(K, N, block_size)
    s = np.asarray(scales).reshape(N // TILE_ROWS, TILE_ROWS, K // TILE_K, TILE_K // block_size)
    return np.ascontiguousarray(s.transpose(0, 2, 1, 3)).reshape(np.shape(scales))


def unpack_scales(packed: np.ndarray, N: int, K: int, block_size: int) -> np.ndarray:
    """The inverse of pack_scales."""
    _check(K, N, block_size)
    s = np.asarray(packed).reshape(N // TILE_ROWS, K // TILE_K, TILE_ROWS, TILE_K // block_size)
    return np.ascontiguousarray(s.transpose(0, 2, 1, 3)).reshape(np.shape(packed))


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class ExternalWeights:
    """Where pack_model reads weights stored as external data (relative to `source_folder`, the
    folder of the model file) and writes the packed ones: appended to `target` (a new file next to
    the packed model, named relative to it in the tensors' external-data entries). One tensor is in
    memory at a time."""

    ALIGN = 4096

    def __init__(self, source_folder: Path, target: Path):
        self.source_folder, self.target = Path(source_folder), Path(target)
        self.written = 0  # bytes in target so far

    def load(self, t: onnx.TensorProto) -> None:
        """Puts the tensor's bytes in its raw_data. Read here rather than by
        onnx.external_data_helper.load_external_data_for_tensor, which refuses data files with
        several hard links: `python -m ops rewrite` hard-links them by design."""
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if not inside_folder(location):
            raise ValueError(f"external data location {info.get('location')!r} is not a relative path inside "
                             "the model's folder")
        with open(self.source_folder / location, "rb") as f:
            f.seek(int(info.get("offset", 0)))
            t.raw_data = f.read(int(info["length"])) if "length" in info else f.read()

    def write(self, t: onnx.TensorProto, data: bytes) -> None:
        pad = (-self.written) % self.ALIGN
        with open(self.target, "ab") as f:
            f.write(b"\0" * pad)
            f.write(data)
        offset = self.written + pad
        self.written = offset + len(data)
        t.raw_data = data
        external_data_helper.set_external_data(t, self.target.name, offset, len(data))
        t.ClearField("raw_data")


def our_matmul_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ort_mtp MatMulNBits nodes of the main graph: the nodes pack_model looks at."""
    return [node for node in model.graph.node if node.domain == DOMAIN and node.op_type == MATMUL_NBITS]


class GraphIndex:
    """The main graph's initializers by name and how many node inputs use each name: what packable()
    looks up, built once per graph rather than once per node."""

    def __init__(self, model: onnx.ModelProto):
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.uses: dict[str, int] = {}
        for node in model.graph.node:
            for name in node.input:
                self.uses[name] = self.uses.get(name, 0) + 1


def node_label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "?")


_SECOND_SET = (6, 7, 8)  # B2, scales2, zero_points2 of a two-weight node (attribute N2 > 0)


def weight_sets(node: onnx.NodeProto) -> list[tuple[int, str, str, str]]:
    """(N, B, scales, zero_points) of each weight set the node has: its first (inputs 1-3), and the
    second (inputs 6-8, N2 columns) of a two-weight node. Names are "" where an input is absent."""
    attrs = _attributes(node)
    inputs = list(node.input) + [""] * (9 - len(node.input))
    sets = [(attrs.get("N", 0), inputs[1], inputs[2], inputs[3])]
    if attrs.get("N2", 0):
        sets.append((attrs["N2"], *(inputs[i] for i in _SECOND_SET)))
    return sets


def packable(model: onnx.ModelProto, node: onnx.NodeProto, index: GraphIndex | None = None) -> str | None:
    """Why this ort_mtp MatMulNBits node cannot take the tiles layout, or None: the one statement of
    eligibility, shared by pack_model (`ops rewrite --pack`) and the driver's tiles cache
    (ops.tiles_cache). Eligible: not packed yet, no g_idx, and for each weight set (weight_sets: a
    two-weight node's two, which the layout takes together or not at all) a shape and type the layout
    takes (tiles_unsupported_reason) and B and scales initializers that no other node reads (their
    bytes are rewritten). Where the bytes are stored is the caller's concern. index: GraphIndex(model),
    to share between the nodes of one graph."""
    index = index or GraphIndex(model)
    attrs = _attributes(node)
    if attrs.get(PACKING_ATTRIBUTE, 0) == TILES:
        return "already in the tiles layout"
    inputs = list(node.input) + [""] * (6 - len(node.input))
    if inputs[4]:
        return "g_idx input"
    inits = index.initializers
    sets = weight_sets(node)
    for number, (N, b_name, s_name, zp_name) in enumerate(sets, 1):
        b_label, s_label = ("B", "scales") if number == 1 else ("B2", "scales2")
        float_type = inits[s_name].data_type if s_name in inits else None
        reason = tiles_unsupported_reason(attrs.get("K", 0), N, attrs.get("bits", 4), attrs.get("block_size", 0),
                                          float_type, bool(zp_name))
        if reason is None and (b_name not in inits or s_name not in inits):
            reason = f"{b_label} or {s_label} is not an initializer"
        if reason is None and (index.uses.get(b_name, 0) > 1 or index.uses.get(s_name, 0) > 1):
            reason = f"{b_label} or {s_label} is shared with another node"
        if reason is not None:
            return reason if len(sets) == 1 else f"weight set {number}: {reason}"
    return None


def pack_model(model: onnx.ModelProto, external: ExternalWeights | None = None,
               on_node=None) -> tuple[int, list[tuple[str, str]]]:
    """Packs, in place, every ort_mtp MatMulNBits node of the main graph that the tiles layout takes
    (packable) whose B and scales it can read: the initializers are rewritten and the node gets
    packing=1. Returns (nodes packed, [(node, why not)] for the other ort_mtp MatMulNBits nodes but
    those already packed). Weights stored as external data are packed through `external` (read from
    the model's folder, written to a new file); without it they must have been loaded
    (onnx.load(..., load_external_data=True)), else the node is skipped. on_node(), if given, is
    called once each of our_matmul_nodes(model) is done with (a progress hook)."""
    index = GraphIndex(model)
    inits = index.initializers
    packed, skipped = 0, []
    for node in _each_then(our_matmul_nodes(model), on_node):
        label = node_label(node)
        attrs = _attributes(node)
        if attrs.get(PACKING_ATTRIBUTE, 0) == TILES:
            continue
        sets = weight_sets(node)
        reason = packable(model, node, index)
        stored = [t.data_location == onnx.TensorProto.EXTERNAL
                  for _, b_name, s_name, _ in sets for t in (inits.get(b_name), inits.get(s_name)) if t]
        if reason is None and any(stored) and external is None:
            reason = "B or scales is external data that was not loaded"
        if reason is not None:
            skipped.append((label, reason))
            continue
        K, bs = attrs["K"], attrs["block_size"]
        for N, b_name, s_name, _ in sets:
            for t, fn in ((inits[b_name], lambda raw, N=N, K=K, bs=bs: pack_tiles(N, K, bs, b=raw)[0].reshape(raw.shape)),
                          (inits[s_name],
                           lambda raw, N=N, K=K, bs=bs: pack_tiles(N, K, bs, scales=raw)[1].reshape(raw.shape))):
                try:
                    _repack(t, fn, external)
                except ValueError as e:  # numpy's message ("cannot reshape ...") names no tensor or file
                    raise ValueError(f"node {label!r} (K={K}, N={N}, block_size={bs}): initializer {t.name!r} "
                                     f"{_stored_where(t)}, dims {list(t.dims)}: {e}") from None
        set_packing(node)
        packed += 1
    return packed, skipped


def set_packing(node: onnx.NodeProto) -> None:
    """Gives the node packing=1 (its weights must be in the tiles layout by the time it runs)."""
    attrs = _attributes(node)
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in {**attrs, PACKING_ATTRIBUTE: TILES}.items())


def _each_then(items, after):
    """Yields each item, then calls after() once the loop body is done with it (whichever way it
    continues); after=None: the items alone."""
    for item in items:
        yield item
        if after is not None:
            after()


def _stored_where(t: onnx.TensorProto) -> str:
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return "(in the model file)"
    location = next((e.value for e in t.external_data if e.key == "location"), "?")
    return f"(in {location})"


def _repack(t: onnx.TensorProto, fn, external: ExternalWeights | None) -> None:
    """Rearranges a uint8 or 16-bit float tensor's elements with fn, on their raw values (so
    bfloat16 needs no conversion), where they are stored: in the proto, or through `external`."""
    dtype = np.uint8 if t.data_type == onnx.TensorProto.UINT8 else np.uint16
    shape = tuple(t.dims)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        external.load(t)
        raw = np.frombuffer(t.raw_data, dtype=dtype).reshape(shape)
        external.write(t, np.ascontiguousarray(fn(raw)).tobytes())
        return
    if t.raw_data:
        raw = np.frombuffer(t.raw_data, dtype=dtype).reshape(shape)
    else:  # uint8 / float16 / bfloat16 in int32_data, one value per entry
        raw = np.asarray(t.int32_data, dtype=dtype).reshape(shape)
    out = np.ascontiguousarray(fn(raw))
    t.ClearField("int32_data")
    t.raw_data = out.tobytes()
