"""A small ONNX graph writer whose initializers stream straight into an external-data file.

Written with onnx.helper protos (not onnx-ir) so that it behaves the same under onnx-ir 1.0 on the
device and 1.1 here, and so that a 15 GB model never has to exist in memory: every initializer is
written chunk by chunk into `<model>.onnx.data` as it is produced, and the graph only holds its
(location, offset, length) reference.

Naming and value_info follow onnxruntime-genai's builder (builders/base.py): constants are
`Constant` nodes named `/model/constant_nodes/{DTYPE}/{value}` with output
`/model/constants/{DTYPE}/{value}`, created on first use; value_info lists every initializer, then
every node output that is not a graph output.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

# dtype names as the builder spells them in constant names, and their numpy/onnx types
DTYPES = {
    "FLOAT": (np.float32, TensorProto.FLOAT),
    "FLOAT16": (np.float16, TensorProto.FLOAT16),
    "INT64": (np.int64, TensorProto.INT64),
    "INT32": (np.int32, TensorProto.INT32),
    "UINT8": (np.uint8, TensorProto.UINT8),
}
IO_DTYPE = {"fp32": "FLOAT", "fp16": "FLOAT16"}

# ORT memory-maps external data whose offset is page aligned; keep big tensors on 4 KiB boundaries.
_BIG_TENSOR = 1 << 16
_PAGE = 4096
_SMALL_ALIGN = 64


class ExternalData:
    """One external-data file, appended tensor by tensor."""

    def __init__(self, folder: str | os.PathLike, filename: str):
        self.folder = Path(folder)
        self.filename = filename
        self.path = self.folder / filename
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close(), kept open across many writes
        self.offset = 0
        self.locations: dict[str, tuple[int, int]] = {}  # tensor name -> (offset, length)

    def _pad_to(self, alignment: int) -> None:
        pad = (-self.offset) % alignment
        if pad:
            self._file.write(b"\0" * pad)
            self.offset += pad

    def write(self, name: str, nbytes: int, chunks: Iterable[np.ndarray]) -> tuple[int, int]:
        """Appends `nbytes` of data given as C-ordered array chunks; returns (offset, length)."""
        self._pad_to(_PAGE if nbytes >= _BIG_TENSOR else _SMALL_ALIGN)
        start = self.offset
        for chunk in chunks:
            view = memoryview(np.ascontiguousarray(chunk)).cast("B")
            self._file.write(view)
            self.offset += view.nbytes
        if self.offset - start != nbytes:
            raise RuntimeError(f"{name}: wrote {self.offset - start} bytes, expected {nbytes}")
        self.locations[name] = (start, nbytes)
        return start, nbytes

    def close(self) -> None:
        self._file.close()


def external_tensor(name: str, dtype: str, shape: Sequence[int], location: str, offset: int, length: int):
    tensor = TensorProto(name=name, data_type=DTYPES[dtype][1], dims=list(shape))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


class GraphWriter:
    """Collects nodes, graph I/O, value_info and external initializers of one ONNX model."""

    def __init__(self, data: ExternalData):
        self.data = data
        self.nodes: list[onnx.NodeProto] = []
        self.node_names: set[str] = set()
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[TensorProto] = []
        self.values: dict[str, tuple[str, list]] = {}  # value_info of node outputs, in creation order

    # --- graph I/O and value_info ---
    def add_input(self, name: str, dtype: str, shape: Sequence) -> None:
        self.inputs.append(helper.make_tensor_value_info(name, DTYPES[dtype][1], list(shape)))

    def add_output(self, name: str, dtype: str, shape: Sequence) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, DTYPES[dtype][1], list(shape)))

    def value(self, name: str, dtype: str, shape: Sequence) -> None:
        self.values[name] = (dtype, list(shape))

    # --- nodes ---
    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str, domain: str = "", **attrs):
        """Adds a node (attributes kept in the given order, like the builder's); constants named
        /model/constants/... are created on first use."""
        if name in self.node_names:  # the builder shares same-named subgraphs the same way
            return
        for input_name in inputs:
            if input_name.startswith("/model/constants/"):
                self._constant(input_name)
        node = helper.make_node(op_type, list(inputs), list(outputs), name=name, domain=domain or None)
        node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
        self.nodes.append(node)
        self.node_names.add(name)

    def _constant(self, name: str) -> None:
        node_name = name.replace("/model/constants/", "/model/constant_nodes/", 1)
        if node_name in self.node_names:
            return
        dtype, literal = name.split("/")[-2:]
        value = np.array(ast.literal_eval(literal), dtype=DTYPES[dtype][0])
        tensor = onnx.numpy_helper.from_array(value, name=name)
        node = helper.make_node("Constant", [], [name], name=node_name)
        node.attribute.append(helper.make_attribute("value", tensor))
        self.nodes.append(node)
        self.node_names.add(node_name)
        self.value(name, dtype, [])  # the builder declares every constant with shape [] (sic)

    # --- initializers ---
    def add_initializer(self, name: str, dtype: str, shape: Sequence[int], chunks: Iterable[np.ndarray]) -> None:
        """Streams a tensor into the external-data file and references it from the graph."""
        itemsize = np.dtype(DTYPES[dtype][0]).itemsize
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        offset, length = self.data.write(name, nbytes, chunks)
        self.initializers.append(external_tensor(name, dtype, shape, self.data.filename, offset, length))

    def reference_initializer(self, name: str, dtype: str, shape: Sequence[int], other: ExternalData) -> None:
        """References a tensor already written to another model's data file (shared initializer)."""
        offset, length = other.locations[name]
        self.initializers.append(external_tensor(name, dtype, shape, other.filename, offset, length))

    # --- output ---
    def to_model(self, producer_version: str) -> onnx.ModelProto:
        value_info = [
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in self.initializers
        ]
        output_names = {v.name for v in self.outputs}
        value_info += [
            helper.make_tensor_value_info(name, DTYPES[dtype][1], shape)
            for name, (dtype, shape) in self.values.items()
            if name not in output_names
        ]
        graph = helper.make_graph(
            self.nodes, "main_graph", self.inputs, self.outputs, self.initializers, value_info=value_info
        )
        model = helper.make_model(
            graph,
            ir_version=10,  # what the builder writes; ORT 1.31 refuses IR > 13
            opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid("com.microsoft", 1)],
            producer_name="ort-mtp.models",
            producer_version=producer_version,
        )
        return model


def save(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Writes the graph; the initializers already live in the external-data file."""
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
