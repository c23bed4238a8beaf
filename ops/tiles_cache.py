"""The tiles layout without a manual step: a graph's packable ort_mtp MatMulNBits weights, packed once
into a per-user cache and handed to ONNX Runtime in place of the folder's row-major bytes.

    weights = ops.tiles_cache.prepare(proto, Path("DIR/model.onnx"))  # proto: in memory, no weights loaded
    if weights is not None:            # the nodes it packed now have packing=1 in `proto`
        weights.add_to(session_options)
        session = ort.InferenceSession(proto.SerializeToString(), session_options, ...)
        session.tiles_weights = weights   # the session reads its memory: keep it as long as the session

The model folder is only read. The cache is `$ORT_MTP_CACHE_DIR`, else ~/.cache/ort-mtp/tiles/, one
folder per key (the sha256 of what the packed bytes depend on: the format, the library file, the
model file and every packed tensor's storage, by path, size and mtime), holding weights.bin (every
packed B and scales, each at a 64-byte boundary) and index.json (where each tensor is, with the crc32
of its first and last 64 KiB). An entry is written under a temporary name and renamed into place, so
a reader sees a whole entry or none; it is checked (format, size, crc32s) before use and rebuilt when
the check fails. Any problem with the cache (no space, no permission, a broken entry that cannot be
replaced) is a logged warning and `prepare` returns None: the session then runs the row-major layout,
which computes the same outputs, only slower on CUDA.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from . import library_path, packing
from .paths import inside_folder
from .progress import progress_bar

FORMAT_VERSION = 1
CACHE_ENV = "ORT_MTP_CACHE_DIR"
DEFAULT_DIR = Path("~/.cache/ort-mtp/tiles")
ALIGN = 64  # every tensor in weights.bin starts here: any element type views it aligned
CHECK_BYTES = 64 * 1024  # crc32 of this much at each end of a tensor: cheap to verify, catches truncation and damage
SPARE_BYTES = 64 << 20  # left free on the cache's disk beyond the entry itself
WEIGHTS, INDEX = "weights.bin", "index.json"
_TMP = re.compile(r"^\.tmp-([0-9a-f]{64})-(\d+)(\.old)?$")

log = logging.getLogger(__name__)


class CacheUnusable(Exception):
    """The cache cannot provide packed weights this time (the message says why); run unpacked."""


def cache_dir() -> Path:
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else DEFAULT_DIR.expanduser()


@dataclass
class _Tensor:
    name: str
    dims: list[int]
    data_type: int
    nbytes: int
    file: Path | None  # the external data file; None: the bytes are in the model file (raw_data)
    offset: int
    proto: onnx.TensorProto

    def source(self) -> np.ndarray:
        """The row-major bytes, read-only: a map of the folder's data file, or the proto's raw_data."""
        if self.file is None:
            return np.frombuffer(self.proto.raw_data, np.uint8)
        return np.memmap(self.file, np.uint8, mode="r", offset=self.offset, shape=(self.nbytes,))


@dataclass
class _Set:
    """One weight set of a node: its first (B, scales), or a two-weight node's second (B2, scales2)."""
    N: int
    b: _Tensor
    scales: _Tensor


@dataclass
class _Node:
    node: onnx.NodeProto
    K: int
    block_size: int
    sets: list[_Set]

    def tensors(self) -> list[_Tensor]:
        return [t for s in self.sets for t in (s.b, s.scales)]


@dataclass
class TilesWeights:
    """Packed initializers for one session, and the memory they live in (a read-only map of the cache
    entry's weights.bin, which the OrtValues point into without a copy)."""

    entry: Path
    nodes: int  # MatMulNBits nodes given packing=1
    names: list[str]
    values: list  # onnxruntime.OrtValue, one per name
    _arrays: list  # what the OrtValues point into
    _map: np.memmap

    def add_to(self, options, skip=frozenset()) -> None:
        """Makes a session built with `options` take these values for the initializers of those names
        (but those in `skip`, which it is given another way) instead of reading the model folder's bytes."""
        kept = [(n, v) for n, v in zip(self.names, self.values) if n not in skip]
        if kept:
            options.add_external_initializers([n for n, _ in kept], [v for _, v in kept])

    def arrays(self) -> dict:
        """name -> the packed bytes (read-only, typed and shaped as the initializer)."""
        return dict(zip(self.names, self._arrays))


def prepare(model: onnx.ModelProto, model_path: Path) -> TilesWeights | None:
    """Packed weights for every node of `model` (the graph of the file `model_path`, loaded without
    external data, its MatMulNBits already on ort_mtp) that can take the tiles layout, from the cache,
    built there first when missing or broken; the nodes get packing=1 in `model`. None when no node
    can, or when the cache is unusable (a warning names the path and why; `model` is then unchanged)."""
    nodes = _candidates(model, Path(model_path))
    if not nodes:
        return None
    root = cache_dir()
    try:
        inputs = _key_inputs(Path(model_path), nodes)
        key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
        entry = root / key
        weights, why = _open(entry, inputs, nodes), None
        if isinstance(weights, str):
            why, weights = weights, None
        if weights is None:
            if why:
                log.warning("tiles cache entry %s is unusable (%s); rebuilding it", entry, why)
            _build(root, key, inputs, nodes, Path(model_path).name, replace=why is not None)
            weights = _open(entry, inputs, nodes)
            if not isinstance(weights, TilesWeights):
                raise CacheUnusable(f"{entry} fails its check right after it was written ({weights})")
    except (OSError, CacheUnusable, ValueError) as e:
        where = getattr(e, "filename", None) or root
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        log.warning("tiles cache %s: %s; %s runs MatMulNBits in its row-major layout", where, reason,
                    Path(model_path).name)
        return None
    for n in nodes:
        packing.set_packing(n.node)
    return weights


def _candidates(model: onnx.ModelProto, model_path: Path) -> list[_Node]:
    """The nodes packing.packable accepts whose B and scales the cache can read and whose sizes match
    the node's attributes (a node that fails here keeps its layout, and ORT reports what is wrong)."""
    index = packing.GraphIndex(model)
    folder = model_path.parent
    out = []
    for node in packing.our_matmul_nodes(model):
        reason = packing.packable(model, node, index)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        sets = []
        if reason is None:
            K, bs = attrs["K"], attrs["block_size"]
            for N, b_name, s_name, _ in packing.weight_sets(node):
                b, reason = _tensor(index.initializers[b_name], folder, N * K // 2)
                if reason is None:
                    scales, reason = _tensor(index.initializers[s_name], folder, N * K // bs * 2)
                if reason is not None:
                    break
                sets.append(_Set(N, b, scales))
        if reason is None:
            out.append(_Node(node, K, bs, sets))
        elif reason != "already in the tiles layout":
            log.debug("%s: %s keeps MatMulNBits' row-major layout: %s", model_path.name, packing.node_label(node),
                      reason)
    return out


def _tensor(t: onnx.TensorProto, folder: Path, nbytes: int) -> tuple[_Tensor | None, str | None]:
    dims = [int(d) for d in t.dims]
    if t.data_location != onnx.TensorProto.EXTERNAL:
        if len(t.raw_data) != nbytes:
            return None, f"{t.name!r} holds {len(t.raw_data)} raw bytes, the node's K and N need {nbytes}"
        return _Tensor(t.name, dims, t.data_type, nbytes, None, 0, t), None
    info = onnx.external_data_helper.ExternalDataInfo(t)
    if not inside_folder(info.location):
        return None, f"{t.name!r}: external data location {info.location!r} is not inside the model's folder"
    length = info.length if info.length else None
    if length != nbytes:
        return None, f"{t.name!r} stores {length} bytes, the node's K and N need {nbytes}"
    return _Tensor(t.name, dims, t.data_type, nbytes, folder / info.location, int(info.offset or 0), t), None


def _stat(path: Path) -> dict:
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _key_inputs(model_path: Path, nodes: list[_Node]) -> dict:
    """Everything the packed bytes depend on, by reference: a change to any file shows in its size
    or mtime (the bytes are not hashed: that would read every weight on every start)."""
    files: dict[Path, dict] = {}
    tensors = []
    for n in nodes:
        for t in n.tensors():
            entry = {"name": t.name, "dims": t.dims, "data_type": t.data_type, "length": t.nbytes,
                     "location": None, "offset": t.offset}
            if t.file is not None:
                if t.file not in files:
                    files[t.file] = _stat(t.file)
                entry.update(location=str(t.file.relative_to(model_path.parent)),
                             file_size=files[t.file]["size"], file_mtime_ns=files[t.file]["mtime_ns"])
            tensors.append(entry)
    return {"format": FORMAT_VERSION, "library": _stat(Path(library_path())), "model": _stat(model_path),
            "nodes": [_key_node(n) for n in nodes],
            "tensors": tensors}


def _key_node(n: _Node) -> dict:
    """A node's part of the key: its first set as a one-weight node's (so entries written before two-weight
    nodes were packed keep their keys), its second set's under "N2", "b2", "scales2"."""
    first = n.sets[0]
    out = {"name": packing.node_label(n.node), "K": n.K, "N": first.N, "block_size": n.block_size,
           "b": first.b.name, "scales": first.scales.name}
    if len(n.sets) > 1:
        out.update(N2=n.sets[1].N, b2=n.sets[1].b.name, scales2=n.sets[1].scales.name)
    return out


def _layout(nodes: list[_Node]) -> tuple[list[tuple[_Tensor, int]], int]:
    """(tensor, offset in weights.bin) for every B and scales, and the file's size."""
    placed, end = [], 0
    for n in nodes:
        for t in n.tensors():
            offset = -(-end // ALIGN) * ALIGN
            placed.append((t, offset))
            end = offset + t.nbytes
    return placed, end


def _checksums(data: np.ndarray) -> tuple[int, int]:
    return zlib.crc32(data[:CHECK_BYTES]), zlib.crc32(data[-CHECK_BYTES:])


def _open(entry: Path, inputs: dict, nodes: list[_Node]) -> TilesWeights | str | None:
    """The entry's weights, checked; None when there is no entry; a string saying what is wrong with
    one that fails the check."""
    import onnxruntime as ort

    try:
        index = json.loads((entry / INDEX).read_text())
    except FileNotFoundError:
        return None if not entry.exists() else f"{INDEX} is missing"
    except (ValueError, UnicodeDecodeError) as e:
        return f"{INDEX} does not parse ({e})"
    if not isinstance(index, dict) or index.get("format") != FORMAT_VERSION:
        return f"format {index.get('format') if isinstance(index, dict) else '?'} is not {FORMAT_VERSION}"
    if index.get("inputs") != inputs:
        return f"{INDEX} describes other inputs than its key's"
    placed, size = _layout(nodes)
    try:
        actual = os.path.getsize(entry / WEIGHTS)
    except FileNotFoundError:
        return f"{WEIGHTS} is missing"
    if actual != size or index.get("size") != size:
        return f"{WEIGHTS} has {actual} bytes, {size} expected"
    listed = index.get("tensors")
    if not isinstance(listed, list) or len(listed) != len(placed):
        return f"{INDEX} lists {len(listed) if isinstance(listed, list) else 'no'} tensors, {len(placed)} expected"
    data = np.memmap(entry / WEIGHTS, np.uint8, mode="r", shape=(size,))
    names, values, arrays = [], [], []
    for (t, offset), item in zip(placed, listed):
        expected = {"name": t.name, "dims": t.dims, "data_type": t.data_type, "offset": offset, "length": t.nbytes}
        if not isinstance(item, dict) or {k: item.get(k) for k in expected} != expected:
            return f"{INDEX}'s entry for {t.name!r} does not match the model"
        raw = data[offset:offset + t.nbytes]
        if list(_checksums(raw)) != [item.get("crc32_head"), item.get("crc32_tail")]:
            return f"{t.name!r} fails its crc32 check"
        if t.data_type == onnx.TensorProto.UINT8:
            array = raw.reshape(t.dims)
            value = ort.OrtValue.ortvalue_from_numpy(array)
        elif t.data_type == onnx.TensorProto.FLOAT16:
            array = raw.view(np.float16).reshape(t.dims)
            value = ort.OrtValue.ortvalue_from_numpy(array)
        else:  # bfloat16: numpy has no such type; ORT takes the bits as uint16 with the ONNX type named
            array = raw.view(np.uint16).reshape(t.dims)
            value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, t.data_type)
        names.append(t.name)
        values.append(value)
        arrays.append(array)
    return TilesWeights(entry, len(nodes), names, values, arrays, data)


def _build(root: Path, key: str, inputs: dict, nodes: list[_Node], label: str, replace: bool) -> None:
    """Writes the entry `root/key`: packed under a temporary name, synced, renamed into place. A
    process that wins the race to the same key keeps its entry (the bytes are the same)."""
    root.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(root)
    placed, size = _layout(nodes)
    free = shutil.disk_usage(root).free
    if free < size + SPARE_BYTES:
        raise CacheUnusable(f"not enough free disk space for a {_mib(size)} entry ({_mib(free)} free)")
    tmp = root / f".tmp-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        listed = _write_weights(tmp / WEIGHTS, nodes, placed, size, label)
        index = {"format": FORMAT_VERSION, "key": key, "size": size, "inputs": inputs, "tensors": listed}
        with open(tmp / INDEX, "w") as f:
            json.dump(index, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        entry = root / key
        if replace:
            _discard(entry, root / f".tmp-{key}-{os.getpid()}.old")
        try:
            os.rename(tmp, entry)
        except OSError:
            if not entry.is_dir():
                raise
            log.info("tiles cache %s was written by another process meanwhile; using it", entry)
        _fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _remove_stale_versions(root, key, inputs["model"]["path"])


def _write_weights(path: Path, nodes: list[_Node], placed, size: int, label: str) -> list[dict]:
    with open(path, "wb") as f:
        f.truncate(size)
    out = np.memmap(path, np.uint8, mode="r+", shape=(size,))  # size > 0: every node has weights
    offsets = {t.name: offset for t, offset in placed}
    with progress_bar(f"packing {label} into the tiles layout", total=size, unit="B", unit_scale=True) as bar:
        for n in nodes:
            for ws in n.sets:
                ob, os_ = offsets[ws.b.name], offsets[ws.scales.name]
                packing.pack_tiles(ws.N, n.K, n.block_size, b=ws.b.source(), scales=ws.scales.source().view(np.uint16),
                                   out_b=out[ob:ob + ws.b.nbytes],
                                   out_scales=out[os_:os_ + ws.scales.nbytes].view(np.uint16), threads=0)
                bar.update(ws.b.nbytes + ws.scales.nbytes)
    listed = []
    for t, offset in placed:
        head, tail = _checksums(out[offset:offset + t.nbytes])
        listed.append({"name": t.name, "dims": t.dims, "data_type": t.data_type, "offset": offset,
                       "length": t.nbytes, "crc32_head": head, "crc32_tail": tail})
    out.flush()
    del out
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return listed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(entry: Path, aside: Path) -> None:
    """Removes a broken entry: renamed aside first, so no reader finds it half deleted."""
    try:
        os.rename(entry, aside)
    except FileNotFoundError:
        return  # another process removed it
    shutil.rmtree(aside, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _remove_dead_temporaries(root: Path) -> None:
    """Temporary entries left by processes that died while writing them."""
    for child in root.iterdir():
        match = _TMP.match(child.name)
        if match and int(match.group(2)) != os.getpid() and not _pid_alive(int(match.group(2))):
            log.info("removing %s, left by process %s, which is gone", child, match.group(2))
            shutil.rmtree(child, ignore_errors=True)


def _remove_stale_versions(root: Path, key: str, model_path: str) -> None:
    """Entries for earlier versions of the same model file (it or its weights changed since): they
    would never be read again. A process still running on one keeps its open map of the file."""
    for child in root.iterdir():
        if child.name == key or child.name.startswith(".") or not child.is_dir():
            continue
        try:
            index = json.loads((child / INDEX).read_text())
            stale = index["inputs"]["model"]["path"] == model_path
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not an entry this version understands: left alone
        if stale:
            log.info("removing %s, an earlier version of %s's packed weights", child, model_path)
            shutil.rmtree(child, ignore_errors=True)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
