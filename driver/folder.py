"""Reading an onnxruntime-genai model folder: genai_config.json, model.onnx, mtp.onnx, tokenizer.json.

Everything the driver needs to know about a folder is read here once and checked against the graphs
themselves (not only the config), so a broken folder fails with a sentence naming the missing piece
before any session is built. Nothing is ever written into the folder: it may be read-only.

Supported: model type qwen3_5_text (Qwen3.5-family hybrids: Gated DeltaNet linear attention plus
gated full attention, and an MTP head), as written by onnxruntime-genai 0.18's builder or by this
project's `python -m models build`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from ops.paths import inside_folder
from ops.rewrite import damaged_text

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

    def weight_bytes(self) -> int:
        """Bytes of the graph's initializers: external data by its recorded lengths, the rest by raw_data."""
        total = 0
        for tensor in self.proto.graph.initializer:
            entries = {e.key: e.value for e in tensor.external_data}
            total += int(entries.get("length", 0)) if "location" in entries else len(tensor.raw_data)
        return total

    def dim_overrides(self, max_len: int) -> dict[str, int]:
        """Values for every symbolic dimension except the sequence width: batch 1, attention mask and
        KV buffers max_len long. With them ORT folds the graph's shape arithmetic into constants, so
        nothing in a forward depends on host-side shapes (needed for CUDA-graph replay)."""
        values = {"batch": 1, "total": max_len, "past": max_len, "head_dim": self.head_size}
        return {symbol: values[role] for symbol, role in self.symbols.items()}


def with_state_window(spec: GraphSpec, window: int) -> GraphSpec:
    """`spec` as its graph reads after ops.state_window.add_state_window(window): every conv and
    recurrent state with a leading axis of `window` slots (the proto stays the folder's)."""
    states = tuple(dataclasses.replace(s, shape=(window, *s.shape)) for s in spec.recurrent)
    return dataclasses.replace(spec, recurrent=states, state_window=window)


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
    mtp: GraphSpec | None  # None when the folder has no usable MTP head
    mtp_unavailable: str | None = None  # why an enabled head is unusable (its files missing or unreadable)

    def require_mtp(self) -> GraphSpec:
        if self.mtp is None:
            why = (f"the MTP head is unavailable: {self.mtp_unavailable}" if self.mtp_unavailable else
                   f"{self.path} has no MTP head (no enabled 'mtp' section with its mtp.onnx in {GENAI_CONFIG})")
            raise DriverError(f"{why}; use --mode greedy")
        return self.mtp


class UnreadableFile(DriverError):
    """A file of the folder is missing or this process may not read it."""


def read_folder(path) -> ModelFolder:
    """Reads and checks a model folder; raises DriverError naming what is missing or malformed."""
    folder = Path(path)
    _check_folder(folder)
    config_path = _require_file(folder / GENAI_CONFIG, missing=f"{folder} is not an onnxruntime-genai model folder: "
                                                               f"{GENAI_CONFIG} is missing")
    model = _read_config(config_path).section("model")
    model_type = model.string("type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DriverError(f"{config_path}: model type {model_type!r} is not supported "
                          f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    decoder = model.section("decoder")
    context_length = model.positive_int("context_length")
    vocab_size = model.positive_int("vocab_size")
    hidden_size = decoder.positive_int("hidden_size")
    eos_ids = model.token_ids("eos_token_id")
    tokenizer = _require_file(folder / TOKENIZER, missing=f"{folder}: {TOKENIZER} is missing (the driver reads text "
                                                          "with the `tokenizers` library)")

    outputs = decoder.section("outputs")
    mtp_config = model.optional_section("mtp")
    head_says = mtp_config.string("main_hidden_states", None) if mtp_config is not None else None
    main_hidden = outputs.string("hidden_states", None) or head_says or "hidden_states"
    head_size = decoder.positive_int("head_size", None)
    main = _graph_spec(folder, decoder.onnx_filename(), decoder.section("inputs"), outputs,
                       hidden_out=main_hidden, hidden_in=None, head_size=head_size)
    _check_sizes(main, vocab_size, hidden_size, config_path)

    mtp, mtp_unavailable = None, None
    if mtp_config is not None and mtp_config.boolean("enabled", True):
        m_inputs, m_outputs = mtp_config.section("inputs"), mtp_config.section("outputs")
        try:
            mtp = _graph_spec(folder, mtp_config.onnx_filename(), m_inputs, m_outputs,
                              hidden_out=m_outputs.string("hidden_states", "hidden_states_out"),
                              hidden_in=m_inputs.string("hidden_states", "hidden_states"),
                              head_size=mtp_config.positive_int("head_size", head_size))
        except UnreadableFile as e:  # only MTP needs the head: greedy runs without its files
            mtp_unavailable = str(e)
    if mtp is not None:
        _check_sizes(mtp, vocab_size, hidden_size, config_path)
        if mtp.recurrent:
            raise DriverError(f"{mtp.path}: an MTP head with linear-attention state is not supported")
        if mtp.io_dtype != main.io_dtype:
            raise DriverError(f"{mtp.path}: hidden/logits type {mtp.io_dtype} differs from the main model's "
                              f"{main.io_dtype}")
    return ModelFolder(folder, model_type, context_length, vocab_size, hidden_size, eos_ids, tokenizer, main, mtp,
                       mtp_unavailable)


# -- genai_config.json ------------------------------------------------------------------------------

_REQUIRED = object()  # default of a key that must be present


class _Section:
    """One JSON object of genai_config.json. Every value the driver uses is read through these typed
    accessors, so a value of the wrong type is an error naming the key, the file and what was
    expected, before it can reach code that would fail on it with a traceback."""

    def __init__(self, values: dict, path: Path, where: str = ""):
        self.values = values
        self.path = path  # the config file
        self.where = where  # dotted prefix of this section's keys, e.g. "model.decoder."

    def section(self, key: str) -> "_Section":
        value = self.values.get(key)
        if not isinstance(value, dict):
            raise DriverError(f"{self.path}: section '{self.where}{key}' is missing or not an object")
        return _Section(value, self.path, f"{self.where}{key}.")

    def optional_section(self, key: str) -> "_Section | None":
        return self.section(key) if key in self.values else None

    def positive_int(self, key: str, default=_REQUIRED) -> int:
        return self._get(key, _is_positive_int, "a positive integer below 2**31", default)

    def string(self, key: str, default=_REQUIRED) -> str:
        return self._get(key, lambda v: isinstance(v, str) and v != "", "a non-empty string", default)

    def boolean(self, key: str, default=_REQUIRED) -> bool:
        return self._get(key, lambda v: isinstance(v, bool), "true or false (a JSON boolean)", default)

    def name_template(self, key: str) -> str | None:
        """A genai per-layer name such as 'past.%d.conv' (None when absent)."""
        return self._get(key, lambda v: isinstance(v, str) and "%d" in v, "a name template with %d", None)

    def token_ids(self, key: str) -> tuple[int, ...]:
        """One token id or a list of them (an absent key: none)."""
        value = self._get(key, lambda v: _is_token_id(v) or (isinstance(v, list) and all(map(_is_token_id, v))),
                          "a token id or a list of token ids (integers from 0 to 2**31-1)", [])
        return tuple(value if isinstance(value, list) else [value])

    def onnx_filename(self) -> str:
        name = self.string("filename")
        if not name.endswith(".onnx") or not inside_folder(name):
            raise DriverError(f"{self.path}: '{self.where}filename' must name an .onnx file inside the folder, "
                              f"got {name!r}")
        return name

    def _get(self, key: str, valid, expected: str, default):
        if key not in self.values:
            if default is _REQUIRED:
                raise DriverError(f"{self.path}: '{self.where}{key}' is missing (expected {expected})")
            return default
        value = self.values[key]
        if not valid(value):
            raise DriverError(f"{self.path}: '{self.where}{key}' must be {expected}, got {_shown(value)}")
        return value


# Sizes and token ids stay below 2**31, far above any real model's (a 262144-token context, a 248320-token
# vocabulary): a JSON integer has no limit of its own, and one past 64 bits reached ONNX Runtime's session
# options (a dimension override) as a TypeError.
_INT_LIMIT = 2**31


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < _INT_LIMIT


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _INT_LIMIT


def _shown(value) -> str:
    """A config value as JSON, cut short: the error stays one readable line."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()


def _read_config(path: Path) -> _Section:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DriverError(f"{path} is not valid JSON ({e})") from None
    except OSError as e:
        raise DriverError(f"{path} cannot be read ({_reason(e)})") from None
    if not isinstance(config, dict):
        raise DriverError(f"{path} must hold a JSON object, got {_shown(config)}")
    return _Section(config, path)


# -- files ------------------------------------------------------------------------------------------


def _check_folder(folder: Path) -> None:
    try:
        exists, is_dir = folder.exists(), folder.is_dir()
    except OSError as e:  # a folder on the way that this user may not enter
        raise DriverError(f"model folder {folder} cannot be opened ({_reason(e)})") from None
    if not exists:
        raise DriverError(f"model folder {folder} does not exist")
    if not is_dir:
        raise DriverError(f"model folder {folder} is not a folder")
    if not os.access(folder, os.X_OK):  # the files are opened by name: entering the folder is what it takes
        raise DriverError(f"model folder {folder} cannot be opened (permission denied)")


def _require_file(path: Path, missing: str | None = None) -> Path:
    """`path` if it is a file this process may read, else an UnreadableFile naming it. Checked up
    front because ORT reports an unreadable external data file as "SystemError : 13", nameless."""
    try:
        found = path.is_file()
    except OSError as e:  # a folder on the way that this user may not enter
        raise UnreadableFile(f"{path} cannot be read ({_reason(e)})") from None
    if not found:
        raise UnreadableFile(missing or f"{path} is missing")
    if not os.access(path, os.R_OK):
        raise UnreadableFile(f"{path} cannot be read (permission denied)")
    return path


def _load_graph(path: Path) -> onnx.ModelProto:
    _require_file(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise DriverError(f"{path} is not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not proto.ir_version or not proto.HasField("graph"):
        raise DriverError(f"{path} is not an ONNX model (no IR version or graph)")
    damaged = damaged_text(proto, path)
    if damaged:
        raise DriverError(damaged)
    for data in _external_data_files(proto, path):  # ORT would fail later with a less direct message
        try:
            _require_file(data)
        except UnreadableFile as e:  # say whose data it is
            raise UnreadableFile(f"{path}: external data file {e}") from None
    return proto


def _external_data_files(proto: onnx.ModelProto, path: Path) -> list[Path]:
    """The files the graph's initializers (of the model file `path`) keep their bytes in (their
    external_data locations). An offset or length that is not a decimal number is refused here
    (weight_bytes reads the lengths)."""
    locations = []
    for init in proto.graph.initializer:
        entries = {e.key: e.value for e in init.external_data}
        for key in ("offset", "length"):
            if key in entries and not (entries[key].isascii() and entries[key].isdigit()):
                raise DriverError(f"{path} is not a valid ONNX model: initializer {init.name!r}'s external "
                                  f"data {key} is {entries[key]!r}, not a number of bytes")
        if init.data_location == onnx.TensorProto.EXTERNAL:
            location = entries.get("location", "")
            if location not in locations:
                locations.append(location)
    return [path.parent / location for location in locations]


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
    if template is None:
        return []
    prefix, suffix = template.split("%d", 1)
    found = []
    for name in names:
        if name.startswith(prefix) and name.endswith(suffix):
            middle = name[len(prefix):len(name) - len(suffix)]
            if middle.isdigit():
                found.append(int(middle))
    return sorted(found)


def _graph_spec(folder: Path, filename: str, inputs: _Section, outputs: _Section, hidden_out: str,
                hidden_in: str | None, head_size: int | None) -> GraphSpec:
    path = folder / filename
    proto = _load_graph(path)
    graph_inputs = {v.name: v for v in proto.graph.input}
    graph_outputs = {v.name: v for v in proto.graph.output}

    def need(names: _Section, key: str, pool: dict, what: str) -> str:
        name = names.string(key, key)  # genai's default name is the key itself
        if name not in pool:
            raise DriverError(f"{path}: {what} '{name}' is missing from the graph")
        return name

    input_ids = need(inputs, "input_ids", graph_inputs, "input")
    attention_mask = need(inputs, "attention_mask", graph_inputs, "input")
    position_ids = need(inputs, "position_ids", graph_inputs, "input")
    logits = need(outputs, "logits", graph_outputs, "output")
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
    if len(mask_dims) != 2:
        raise DriverError(f"{path}: {attention_mask} must be [batch, total sequence], got {mask_dims}")
    note(mask_dims[0], "batch")
    note(mask_dims[1], "total")

    kv: list[StateTensor] = []
    key_template, value_template = inputs.name_template("past_key_names"), inputs.name_template("past_value_names")
    key_layers, value_layers = _layers(key_template, graph_inputs), _layers(value_template, graph_inputs)
    if key_layers != value_layers:
        raise DriverError(f"{path}: attention layers with keys {key_layers} and values {value_layers} differ")
    if not key_layers:
        raise DriverError(f"{path}: no attention KV inputs match '{inputs.where}past_key_names' ({key_template!r})")
    for kind, past_t, present_key in (("key", key_template, "present_key_names"),
                                      ("value", value_template, "present_value_names")):
        present_t = outputs.name_template(present_key)
        for layer in key_layers:
            kv.append(_state(path, kind, layer, past_t, present_t, graph_inputs, graph_outputs, symbols, head_size))

    recurrent: list[StateTensor] = []
    for kind, past_key, present_key in (("conv", "past_conv_names", "present_conv_names"),
                                        ("recurrent", "past_recurrent_names", "present_recurrent_names")):
        past_t, present_t = inputs.name_template(past_key), outputs.name_template(present_key)
        for layer in _layers(past_t, graph_inputs):
            recurrent.append(_state(path, kind, layer, past_t, present_t, graph_inputs, graph_outputs, symbols,
                                    head_size))
    named = {input_ids, attention_mask, position_ids, hidden_in, *(s.past for s in kv + recurrent)}
    _check_inputs_named(path, proto, named, inputs)
    window = _state_window(path, recurrent)
    return GraphSpec(path, proto, input_ids, attention_mask, position_ids, logits, hidden_out, hidden_in, io_dtype,
                     tuple(kv), tuple(recurrent), window, symbols)


def _check_inputs_named(path: Path, proto: onnx.ModelProto, named: set, inputs: _Section) -> None:
    """Every input the graph needs must be one the config names: ORT would otherwise fail at the
    first forward ("Missing Input"). Inputs with an initializer have a default and may stay unbound."""
    defaults = {init.name for init in proto.graph.initializer}
    unnamed = [v.name for v in proto.graph.input if v.name not in named and v.name not in defaults]
    if unnamed:
        listed = ", ".join(f"'{name}'" for name in unnamed[:3])
        if len(unnamed) > 3:
            listed += f" and {len(unnamed) - 3} more"
        which = "input" if len(unnamed) == 1 else "inputs"
        verb = "is" if len(unnamed) == 1 else "are"
        raise DriverError(f"{path}: graph {which} {listed} {verb} not named in '{inputs.where[:-1]}' of "
                          f"{inputs.path.name} (a missing or mistyped name template?)")


def _state(path: Path, kind: str, layer: int, past_template: str, present_template: str | None, graph_inputs,
           graph_outputs, symbols: dict, head_size: int | None) -> StateTensor:
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
        if head is None:
            raise DriverError(f"{path}: '{past}' has no static head size and the config gives none")
        shape = (1, dims[1], -1, head)
    else:
        # [batch, ...] or [W, batch, ...] when windowed; every other axis is static
        rank = 3 if kind == "conv" else 4
        if len(dims) not in (rank, rank + 1):
            raise DriverError(f"{path}: '{past}' must have {rank} dimensions ({rank + 1} with a state window), "
                              f"got {dims}")
        batch_axis = 1 if len(dims) == rank + 1 else 0
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


def _check_sizes(spec: GraphSpec, vocab_size: int, hidden_size: int, config_path: Path) -> None:
    """The config's vocab_size and hidden_size size the driver's buffers: they must be the graph's
    (a mismatch would fail at the first forward, as an ORT shape error on a bound output)."""
    values = {v.name: v for v in (*spec.proto.graph.input, *spec.proto.graph.output)}
    checks = [(spec.logits, vocab_size, "model.vocab_size"),
              (spec.hidden_out, hidden_size, "model.decoder.hidden_size")]
    if spec.hidden_in is not None:
        checks.append((spec.hidden_in, hidden_size, "model.decoder.hidden_size"))
    for name, size, key in checks:
        dims = _dims(values[name])
        if dims and isinstance(dims[-1], int) and dims[-1] > 0 and dims[-1] != size:
            raise DriverError(f"{spec.path}: '{name}' has {dims[-1]} columns but {config_path.name} says "
                              f"'{key}' is {size}")
