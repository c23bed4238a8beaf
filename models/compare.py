"""Structural comparison of two model folders (ours vs onnxruntime-genai's builder): everything
a loader can see except the weight values themselves and where they sit in the data files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

# genai_config values that legitimately differ: byte offsets of shared tensors in model.onnx.data
# (the builder writes tensors in another order).
_LAYOUT_KEYS = {"offset"}


def _type(value_info) -> tuple:
    t = value_info.type.tensor_type
    return t.elem_type, tuple(d.dim_param or d.dim_value for d in t.shape.dim)


def _attrs(node) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, onnx.TensorProto):
            v = (v.data_type, tuple(v.dims), numpy_helper.to_array(v).tolist())
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list):
            v = tuple(v)
        out[a.name] = v
    return out


def _location(tensor) -> str | None:
    return {e.key: e.value for e in tensor.external_data}.get("location")


def compare_graphs(ours: onnx.ModelProto, theirs: onnx.ModelProto, label: str) -> list[str]:
    diffs: list[str] = []
    if ours.ir_version != theirs.ir_version:
        diffs.append(f"{label}: ir_version {ours.ir_version} != {theirs.ir_version}")
    opsets = lambda m: sorted((o.domain, o.version) for o in m.opset_import)  # noqa: E731
    if opsets(ours) != opsets(theirs):
        diffs.append(f"{label}: opsets {opsets(ours)} != {opsets(theirs)}")
    g, h = ours.graph, theirs.graph
    for kind in ("input", "output"):
        a = [(v.name, *_type(v)) for v in getattr(g, kind)]
        b = [(v.name, *_type(v)) for v in getattr(h, kind)]
        if a != b:
            diffs.append(f"{label}: graph {kind}s differ: {sorted(set(a) ^ set(b))[:6] or 'order'}")

    count = lambda gr: Counter((n.domain or "ai.onnx", n.op_type) for n in gr.node)  # noqa: E731
    if count(g) != count(h):
        diffs.append(f"{label}: op counts differ: ours-theirs {dict(count(g) - count(h))}, theirs-ours {dict(count(h) - count(g))}")
    ours_nodes = {n.name: n for n in g.node}
    theirs_nodes = {n.name: n for n in h.node}
    for name in sorted(set(ours_nodes) ^ set(theirs_nodes))[:10]:
        diffs.append(f"{label}: node {name} only in {'ours' if name in ours_nodes else 'theirs'}")
    for name in sorted(set(ours_nodes) & set(theirs_nodes)):
        a, b = ours_nodes[name], theirs_nodes[name]
        for what, x, y in (
            ("op", (a.domain or "", a.op_type), (b.domain or "", b.op_type)),
            ("inputs", list(a.input), list(b.input)),
            ("outputs", list(a.output), list(b.output)),
            ("attributes", _attrs(a), _attrs(b)),
        ):
            if x != y:
                diffs.append(f"{label}: node {name} {what}: ours {x} != theirs {y}")

    ours_init = {t.name: (t.data_type, tuple(t.dims), _location(t)) for t in g.initializer}
    theirs_init = {t.name: (t.data_type, tuple(t.dims), _location(t)) for t in h.initializer}
    for name in sorted(set(ours_init) | set(theirs_init)):
        if ours_init.get(name) != theirs_init.get(name):
            diffs.append(f"{label}: initializer {name}: ours {ours_init.get(name)} != theirs {theirs_init.get(name)}")

    ours_vi = {v.name: _type(v) for v in g.value_info}
    theirs_vi = {v.name: _type(v) for v in h.value_info}
    for name in sorted(set(ours_vi) | set(theirs_vi)):
        if ours_vi.get(name) != theirs_vi.get(name):
            diffs.append(f"{label}: value_info {name}: ours {ours_vi.get(name)} != theirs {theirs_vi.get(name)}")
    return diffs


def _compare_json(a, b, path: str, diffs: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            diffs.append(f"genai_config{path}: keys {list(a)} != {list(b)}")
        for key in a.keys() & b.keys():
            if key not in _LAYOUT_KEYS:
                _compare_json(a[key], b[key], f"{path}.{key}", diffs)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _compare_json(x, y, f"{path}[{i}]", diffs)
    elif a != b:
        diffs.append(f"genai_config{path}: {a!r} != {b!r}")


def compare_folders(ours: str | Path, theirs: str | Path) -> list[str]:
    """Differences between two folders; [] means a loader cannot tell them apart by structure."""
    ours, theirs = Path(ours), Path(theirs)
    diffs: list[str] = []
    for filename in ("model.onnx", "mtp.onnx"):
        diffs += compare_graphs(
            onnx.load(ours / filename, load_external_data=False),
            onnx.load(theirs / filename, load_external_data=False),
            filename,
        )
    with open(ours / "genai_config.json") as f, open(theirs / "genai_config.json") as g:
        _compare_json(json.load(f), json.load(g), "", diffs)
    for name in ("genai_config.json", "model.onnx", "model.onnx.data", "mtp.onnx", "mtp.onnx.data", "tokenizer.json", "tokenizer_config.json"):
        if (theirs / name).exists() and not (ours / name).exists():
            diffs.append(f"file {name} missing")
    return diffs
