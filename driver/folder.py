"""Reading an onnxruntime-genai model folder: genai_config.json, model.onnx, mtp.onnx, tokenizer.json.

Everything the driver needs to know about a folder is read here once and checked against the graphs
themselves (not only the config), so a broken folder fails with a sentence naming the missing piece
before any session is built. Nothing is ever written into the folder: it may be read-only.

Supported: model type qwen3_5_text (Qwen3.5-family hybrids: Gated DeltaNet linear attention plus
gated full attention, and an MTP head), as written by onnxruntime-genai 0.18's builder or by this
project's `python -m models build`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from .errors import DriverError

SUPPORTED_MODEL_TYPES = ("qwen3_5_text",)
GENAI_CONFIG = "genai_config.json"
TOKENIZER = "tokenizer.json"

_NUMPY_TYPES = {
    onnx.TensorProto.FLOAT: np.dtype(np.float32),
    onnx.TensorProto.FLOAT16: np.dtype(np.float16),
    onnx.TensorProto.INT64: np.dtype(np.int64),
    onnx.TensorProto.INT32: np.dtype(np.int32),
}


@dataclass(frozen=True)
class StateTensor:
    """One loop-carried tensor: the graph reads `past` and writes `present` of the same shape.

    shape uses -1 for the axis that grows with the sequence (attention KV only; the driver fills in
    its buffer length). For windowed states (state_window W > 0) the leading axis is the window:
    slot W-1 is what the next forward reads, slot j the state after token T-W+j of a T-token forward.
    """

    kind: str  # "key", "value", "conv" or "recurrent"
    layer: int
    past: str
    present: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX graph of the folder (the main model or the MTP head) and its I/O names."""

    path: Path
    proto: onnx.ModelProto  # loaded without external data
    input_ids: str
    attention_mask: str
    position_ids: str
    logits: str
    hidden_out: str  # main: final normed hidden feeding the head; head: its own, for chaining
    hidden_in: str | None  # head only: the hidden paired with each input token
    io_dtype: np.dtype  # logits / hidden dtype
    kv: tuple[StateTensor, ...]
    recurrent: tuple[StateTensor, ...]  # conv and recurrent states of the linear-attention layers
    state_window: int  # 0: one state per tensor; W > 0: W per-token slots on the leading axis
    symbols: dict  # symbolic dim name -> role: "batch", "total", "past" or "head_dim"

    @property
    def head_size(self) -> int:
        return self.kv[0].shape[3]

    def dim_overrides(self, max_len: int) -> dict[str, int]:
        """Values for every symbolic dimension except the sequence width: batch 1, attention mask and
        KV buffers max_len long. With them ORT folds the graph's shape arithmetic into constants, so
        nothing in a forward depends on host-side shapes (needed for CUDA-graph replay)."""
        values = {"batch": 1, "total": max_len, "past": max_len, "head_dim": self.head_size}
        return {symbol: values[role] for symbol, role in self.symbols.items()}


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    model_type: str
    context_length: int
    vocab_size: int
    hidden_size: int
    eos_token_ids: tuple[int, ...]
    tokenizer: Path
    main: GraphSpec
    mtp: GraphSpec | None  # None when the folder has no MTP head

    def require_mtp(self) -> GraphSpec:
        if self.mtp is None:
            raise DriverError(f"{self.path} has no MTP head (no enabled 'mtp' section with its mtp.onnx in "
                              f"{GENAI_CONFIG}); use --mode greedy")
        return self.mtp


def read_folder(path) -> ModelFolder:
    """Reads and checks a model folder; raises DriverError naming what is missing or malformed."""
    folder = Path(path)
    if not folder.exists():
        raise DriverError(f"model folder {folder} does not exist")
    if not folder.is_dir():
        raise DriverError(f"model folder {folder} is not a folder")
    config_path = folder / GENAI_CONFIG
    if not config_path.is_file():
        raise DriverError(f"{folder} is not an onnxruntime-genai model folder: {GENAI_CONFIG} is missing")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DriverError(f"{config_path} is not valid JSON ({e})") from None
    model = _section(config, "model", config_path)
    model_type = model.get("type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DriverError(f"{config_path}: model type {model_type!r} is not supported "
                          f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    decoder = _section(model, "decoder", config_path, "model.")
    context_length = _positive_int(model, "context_length", config_path)
    vocab_size = _positive_int(model, "vocab_size", config_path)
    hidden_size = _positive_int(decoder, "hidden_size", config_path)
    eos = model.get("eos_token_id", [])
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))

    tokenizer = folder / TOKENIZER
    if not tokenizer.is_file():
        raise DriverError(f"{folder}: {TOKENIZER} is missing (the driver reads text with the `tokenizers` library)")

    inputs = _section(decoder, "inputs", config_path, "model.decoder.")
    outputs = _section(decoder, "outputs", config_path, "model.decoder.")
    mtp_section = model.get("mtp")
    main_hidden = outputs.get("hidden_states") or (mtp_section or {}).get("main_hidden_states") or "hidden_states"
    main = _graph_spec(
        folder, _filename(decoder, config_path, "model.decoder"), inputs, outputs,
        hidden_out=main_hidden, hidden_in=None, head_size=decoder.get("head_size"))
    _check_vocab(main, vocab_size)

    mtp = None
    if isinstance(mtp_section, dict) and mtp_section.get("enabled", True):
        m_inputs = _section(mtp_section, "inputs", config_path, "model.mtp.")
        m_outputs = _section(mtp_section, "outputs", config_path, "model.mtp.")
        mtp = _graph_spec(
            folder, _filename(mtp_section, config_path, "model.mtp"), m_inputs, m_outputs,
            hidden_out=m_outputs.get("hidden_states", "hidden_states_out"),
            hidden_in=m_inputs.get("hidden_states", "hidden_states"),
            head_size=mtp_section.get("head_size", decoder.get("head_size")))
        _check_vocab(mtp, vocab_size)
        if mtp.recurrent:
            raise DriverError(f"{mtp.path}: an MTP head with linear-attention state is not supported")
        if mtp.io_dtype != main.io_dtype:
            raise DriverError(f"{mtp.path}: hidden/logits type {mtp.io_dtype} differs from the main model's "
                              f"{main.io_dtype}")
    return ModelFolder(folder, model_type, context_length, vocab_size, hidden_size, eos_ids, tokenizer, main, mtp)


# --------------------------------------------------------------------------------------------------


def _section(parent: dict, key: str, config_path: Path, prefix: str = "") -> dict:
    value = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(value, dict):
        raise DriverError(f"{config_path}: section '{prefix}{key}' is missing or not an object")
    return value


def _positive_int(section: dict, key: str, config_path: Path) -> int:
    value = section.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DriverError(f"{config_path}: '{key}' must be a positive integer, got {value!r}")
    return value


def _filename(section: dict, config_path: Path, where: str) -> str:
    name = section.get("filename")
    if not isinstance(name, str) or not name.endswith(".onnx") or Path(name).is_absolute() or ".." in Path(name).parts:
        raise DriverError(f"{config_path}: '{where}.filename' must name an .onnx file inside the folder, got {name!r}")
    return name


def _load_graph(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise DriverError(f"{path} is missing")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise DriverError(f"{path} is not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not proto.ir_version or not proto.HasField("graph"):
        raise DriverError(f"{path} is not an ONNX model (no IR version or graph)")
    for init in proto.graph.initializer:  # ORT would fail later with a less direct message
        if init.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in init.external_data if e.key == "location"), "")
            if not (path.parent / location).is_file():
                raise DriverError(f"{path}: external data file {path.parent / location} is missing")
    return proto


def _dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param if d.dim_param else d.dim_value for d in value.type.tensor_type.shape.dim]


def _dtype(value: onnx.ValueInfoProto, path: Path) -> np.dtype:
    elem = value.type.tensor_type.elem_type
    if elem not in _NUMPY_TYPES:
        raise DriverError(f"{path}: {value.name} has unsupported element type "
                          f"{onnx.TensorProto.DataType.Name(elem)}")
    return _NUMPY_TYPES[elem]


def _layers(template: str | None, names) -> list[int]:
    """Layer indices whose name matches a genai name template such as 'past_key_values.%d.key'."""
    if not template or "%d" not in template:
        return []
    prefix, suffix = template.split("%d", 1)
    found = []
    for name in names:
        if name.startswith(prefix) and name.endswith(suffix):
            middle = name[len(prefix):len(name) - len(suffix)]
            if middle.isdigit():
                found.append(int(middle))
    return sorted(found)


def _graph_spec(folder: Path, filename: str, inputs: dict, outputs: dict, hidden_out: str,
                hidden_in: str | None, head_size) -> GraphSpec:
    path = folder / filename
    proto = _load_graph(path)
    graph_inputs = {v.name: v for v in proto.graph.input}
    graph_outputs = {v.name: v for v in proto.graph.output}

    def need(names: dict, key: str, default: str, pool: dict, what: str) -> str:
        name = names.get(key, default)
        if name not in pool:
            raise DriverError(f"{path}: {what} '{name}' is missing from the graph")
        return name

    input_ids = need(inputs, "input_ids", "input_ids", graph_inputs, "input")
    attention_mask = need(inputs, "attention_mask", "attention_mask", graph_inputs, "input")
    position_ids = need(inputs, "position_ids", "position_ids", graph_inputs, "input")
    logits = need(outputs, "logits", "logits", graph_outputs, "output")
    if hidden_out not in graph_outputs:
        raise DriverError(f"{path}: output '{hidden_out}' (the hidden state the MTP head reads) is missing; "
                          "rebuild the folder with its MTP head")
    if hidden_in is not None and hidden_in not in graph_inputs:
        raise DriverError(f"{path}: input '{hidden_in}' is missing from the graph")
    if _dtype(graph_inputs[input_ids], path) != np.int64:
        raise DriverError(f"{path}: input '{input_ids}' must be int64")
    pos_dims = _dims(graph_inputs[position_ids])
    if len(pos_dims) != 3 or pos_dims[0] != 3:
        raise DriverError(f"{path}: position_ids must be [3, batch, sequence] (MRoPE), got {pos_dims}")
    io_dtype = _dtype(graph_outputs[logits], path)

    symbols: dict = {}

    def note(symbol, role: str):
        if isinstance(symbol, str) and symbol:
            symbols.setdefault(symbol, role)

    mask_dims = _dims(graph_inputs[attention_mask])
    note(mask_dims[0], "batch")
    note(mask_dims[1], "total")

    kv: list[StateTensor] = []
    key_layers = _layers(inputs.get("past_key_names"), graph_inputs)
    value_layers = _layers(inputs.get("past_value_names"), graph_inputs)
    if key_layers != value_layers:
        raise DriverError(f"{path}: attention layers with keys {key_layers} and values {value_layers} differ")
    if not key_layers:
        raise DriverError(f"{path}: no attention KV inputs match '{inputs.get('past_key_names')}'")
    for kind, past_t, present_t in (("key", "past_key_names", "present_key_names"),
                                    ("value", "past_value_names", "present_value_names")):
        for layer in key_layers:
            kv.append(_state(path, kind, layer, inputs[past_t], outputs.get(present_t), graph_inputs, graph_outputs,
                             symbols, head_size))

    recurrent: list[StateTensor] = []
    for kind, past_t, present_t in (("conv", "past_conv_names", "present_conv_names"),
                                    ("recurrent", "past_recurrent_names", "present_recurrent_names")):
        for layer in _layers(inputs.get(past_t), graph_inputs):
            recurrent.append(_state(path, kind, layer, inputs[past_t], outputs.get(present_t), graph_inputs,
                                    graph_outputs, symbols, head_size))
    window = _state_window(path, recurrent)
    return GraphSpec(path, proto, input_ids, attention_mask, position_ids, logits, hidden_out, hidden_in, io_dtype,
                     tuple(kv), tuple(recurrent), window, symbols)


def _state(path: Path, kind: str, layer: int, past_template: str, present_template: str | None, graph_inputs,
           graph_outputs, symbols: dict, head_size) -> StateTensor:
    past = past_template.replace("%d", str(layer))
    if not present_template:
        raise DriverError(f"{path}: the config names no present output for '{past}'")
    present = present_template.replace("%d", str(layer))
    if present not in graph_outputs:
        raise DriverError(f"{path}: output '{present}' (the update of '{past}') is missing from the graph")
    dims = _dims(graph_inputs[past])
    dtype = _dtype(graph_inputs[past], path)
    if kind in ("key", "value"):
        # [batch, kv_heads, sequence, head_size]: the sequence axis is the buffer length, set later
        if len(dims) != 4 or not isinstance(dims[1], int):
            raise DriverError(f"{path}: '{past}' must be [batch, kv_heads, sequence, head_size], got {dims}")
        for symbol, role in ((dims[0], "batch"), (dims[2], "past"), (dims[3], "head_dim")):
            if isinstance(symbol, str):
                symbols.setdefault(symbol, role)
        head = dims[3] if isinstance(dims[3], int) and dims[3] > 0 else head_size
        if not isinstance(head, int) or head <= 0:
            raise DriverError(f"{path}: '{past}' has no static head size and the config gives none")
        shape = (1, dims[1], -1, head)
    else:
        # [batch, ...] or [W, batch, ...] when windowed; every other axis is static
        batch_axis = 1 if len(dims) == (4 if kind == "conv" else 5) else 0
        if isinstance(dims[batch_axis], str):
            symbols.setdefault(dims[batch_axis], "batch")
        rest = [d for i, d in enumerate(dims) if i != batch_axis]
        if not all(isinstance(d, int) and d > 0 for d in rest):
            raise DriverError(f"{path}: '{past}' must have static dimensions besides batch, got {dims}")
        shape = tuple(1 if i == batch_axis else d for i, d in enumerate(dims))
    return StateTensor(kind, layer, past, present, tuple(shape), dtype)


def _state_window(path: Path, recurrent: list[StateTensor]) -> int:
    windows = set()
    for s in recurrent:
        windowed = len(s.shape) == (4 if s.kind == "conv" else 5)
        windows.add(s.shape[0] if windowed else 0)
    if len(windows) > 1:
        raise DriverError(f"{path}: conv/recurrent states disagree on the state window ({sorted(windows)})")
    return windows.pop() if windows else 0


def _check_vocab(spec: GraphSpec, vocab_size: int) -> None:
    out = next(v for v in spec.proto.graph.output if v.name == spec.logits)
    dims = _dims(out)
    if dims and isinstance(dims[-1], int) and dims[-1] != vocab_size:
        raise DriverError(f"{spec.path}: logits have {dims[-1]} columns but genai_config.json says vocab_size "
                          f"{vocab_size}")
