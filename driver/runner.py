"""One graph (the main model or the MTP head) with its device buffers, allocated once.

Buffers, all sized for the longest sequence (max_len) and the widest forward (max_width):
  ids [1, max_width]           token ids of the next forward (a forward of width w reads ids[:, :w])
  positions {w: [3, 1, w]}     MRoPE positions (text: the three rows are equal), one buffer per width
  mask [1, max_len]            attention mask, ones over the cache plus the forward's tokens
  hidden_in [1, max_width, H]  head only: the hidden paired with each input token
  logits [1, max_width, V], hidden [1, max_width, H]   outputs of the last forward (its first w rows)
  kv[i] [1, kv_heads, max_len, head]   attention KV, past and present bound to the same buffer
  states[i] = (A, B)           conv / recurrent state, double-buffered: a forward reads the live one
                               (`parity`) and writes the other.

Why double buffers for the linear-attention state: the verify forward then leaves the state it
started from untouched, so a rejected draft "restores the snapshot" by simply not flipping `parity`
(no copy at all); and under CUDA-graph capture an in-place update of that state is what
onnxruntime-genai found to drift (its recurrent_state.cpp double-buffers whenever graphs are on).
The KV cache needs no second buffer: rows past the committed length are ignored (the mask says how
long the cache is) and overwritten by the next forward.

A forward never commits anything by itself: `forward(w)` runs at the committed length, and the
caller then calls `advance(n)` (keep n tokens and the written state) or leaves the state as it was.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .device import bind
from .errors import DriverError
from .folder import GraphSpec


class GraphRunner:
    def __init__(self, spec: GraphSpec, session: ort.InferenceSession, device, max_len: int, max_width: int,
                 vocab_size: int, hidden_size: int, capture_widths=()):
        self.spec = spec
        self.session = session
        self.device = device
        self.max_len = max_len
        self.max_width = max_width
        self.capture_widths = set(capture_widths)  # widths replayed from CUDA graphs (when enabled)
        xp = device.xp
        self.xp = xp
        self.ids = device.zeros((1, max_width), np.int64)
        self.mask = device.zeros((1, max_len), np.int64)
        self.logits = device.zeros((1, max_width, vocab_size), spec.io_dtype)
        self.hidden = device.zeros((1, max_width, hidden_size), spec.io_dtype)
        self.hidden_in = device.zeros((1, max_width, hidden_size), spec.io_dtype) if spec.hidden_in else None
        self.kv = [device.zeros(tuple(max_len if d == -1 else d for d in s.shape), s.dtype) for s in spec.kv]
        self.states = [(device.zeros(s.shape, s.dtype), device.zeros(s.shape, s.dtype)) for s in spec.recurrent]
        self._iota = xp.arange(max_width, dtype=np.int64)
        self._positions: dict[int, object] = {}
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._run_options: dict[int | None, ort.RunOptions] = {}
        self.length = 0  # tokens in the cache
        self.parity = 0  # states[i][parity] is the live state
        self._mask_len = 0
        self.graph_runs: dict[int, int] = {}  # CUDA graph id -> runs with that id

    # -- the two things a decoding loop does with a graph ------------------------------------------

    def forward(self, width: int) -> None:
        """Runs ids[:, :width] at positions length .. length+width-1. Results land in logits/hidden
        rows 0..width-1, KV rows length.., and the non-live state buffer; nothing is committed."""
        if self.length + width > self.max_len:
            raise RuntimeError(f"forward of {width} tokens at length {self.length} overflows {self.max_len}")
        self._set_mask(self.length + width)
        positions = self._positions_buffer(width)
        positions[...] = self._iota[:width] + self.length  # broadcast over the 3 MRoPE rows
        graph_id = self._graph_id(width)
        try:
            self.session.run_with_iobinding(self._binding(width, self.parity), self._options(graph_id))
        except Exception as e:  # ORT's own error types: a model whose nodes refuse their inputs, say
            text = str(e).replace("Error in execution: ", "").strip().splitlines()
            raise DriverError(f"{self.spec.path}: ONNX Runtime failed running the model "
                              f"({text[0] if text else type(e).__name__})") from None
        if graph_id is not None:
            self.graph_runs[graph_id] = self.graph_runs.get(graph_id, 0) + 1

    def advance(self, tokens: int) -> None:
        """Commits the last forward: its first `tokens` tokens stay in the KV cache and the state it
        wrote becomes the live state."""
        self.length += tokens
        if self.states:
            self.parity ^= 1

    def rewind(self, length: int) -> None:
        """Forgets KV rows from `length` on (the head after speculative draft steps). Only valid for
        graphs without linear-attention state."""
        assert not self.states, "a recurrent state cannot be rewound; keep its parity instead"
        self.length = length

    def live_states(self) -> list:
        return [pair[self.parity] for pair in self.states]

    def reset(self) -> None:
        """Empty cache for a new prompt (state buffers zeroed: the graphs read them at length 0)."""
        self.length = 0
        self.parity = 0
        for pair in self.states:
            for buffer in pair:
                buffer[...] = 0
        self._set_mask(0)

    # -- internals ----------------------------------------------------------------------------------

    def _set_mask(self, total: int) -> None:
        if total > self._mask_len:
            self.mask[0, self._mask_len:total] = 1
        elif total < self._mask_len:
            self.mask[0, total:self._mask_len] = 0
        self._mask_len = total

    def _positions_buffer(self, width: int):
        buffer = self._positions.get(width)
        if buffer is None:
            buffer = self._positions[width] = self.device.zeros((3, 1, width), np.int64)
        return buffer

    def _graph_id(self, width: int) -> int | None:
        """CUDA graph id of a forward, or None (eager). One graph per (width, parity): a captured
        graph replays fixed buffer addresses, and the two parities bind different state buffers."""
        if not self.device.graph_capture or width not in self.capture_widths:
            return None
        return 1 + 2 * width + self.parity

    def _options(self, graph_id: int | None) -> ort.RunOptions:
        options = self._run_options.get(graph_id)
        if options is None:
            options = self._run_options[graph_id] = self.device.run_options(graph_id)
        return options

    def _binding(self, width: int, parity: int) -> ort.IOBinding:
        key = (width, parity)
        binding = self._bindings.get(key)
        if binding is not None:
            return binding
        spec, device = self.spec, self.device
        binding = self.session.io_binding()
        bind(binding, device, spec.input_ids, self.ids, (1, width))
        bind(binding, device, spec.attention_mask, self.mask, self.mask.shape)
        bind(binding, device, spec.position_ids, self._positions_buffer(width), (3, 1, width))
        if spec.hidden_in:
            bind(binding, device, spec.hidden_in, self.hidden_in, (1, width, self.hidden_in.shape[2]))
        for s, buffer in zip(spec.kv, self.kv):
            bind(binding, device, s.past, buffer, buffer.shape)
            bind(binding, device, s.present, buffer, buffer.shape, output=True)
        for s, pair in zip(spec.recurrent, self.states):
            bind(binding, device, s.past, pair[parity], s.shape)
            bind(binding, device, s.present, pair[1 - parity], s.shape, output=True)
        bind(binding, device, spec.logits, self.logits, (1, width, self.logits.shape[2]), output=True)
        bind(binding, device, spec.hidden_out, self.hidden, (1, width, self.hidden.shape[2]), output=True)
        self._bindings[key] = binding
        return binding
