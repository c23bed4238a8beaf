"""An independent numpy forward of a Qwen3.5 model folder: full sequence, no cache, float64.

Written from the Hugging Face definition (transformers' modeling_qwen3_5.py), not from the ONNX
graph: it reads only the initializers (by the builder's names) and the shapes, so a wrong wiring,
attribute or weight layout in the graph shows up as a mismatch against it. For text, the three
MRoPE position rows are equal, so interleaved MRoPE is plain partial RoPE.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .weights import dequantize


def load_initializers(path: str | Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path), load_external_data=True)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@dataclass
class FolderShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    layer_types: list[str]
    lin_k_heads: int
    lin_v_heads: int
    lin_dk: int
    lin_dv: int
    rotary_dim: int


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


class Weights:
    """Initializers of one graph as float64, with projections as W [N, K] whatever the precision."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.t = tensors

    def proj(self, base: str) -> np.ndarray:
        if f"{base}.MatMul.weight_Q4" in self.t:
            return dequantize(self.t[f"{base}.MatMul.weight_Q4"], self.t[f"{base}.MatMul.weight_scales"]).astype(np.float64)
        return self.t[f"{base}.MatMul.weight"].astype(np.float64).T

    def __getitem__(self, name: str) -> np.ndarray:
        return self.t[name].astype(np.float64)


class Reference:
    """reference.logits(tokens) -> [S, V]; reference.mtp(tokens, hidden) -> (logits, hidden_out)."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self.main = Weights(load_initializers(folder / "model.onnx"))
        self.head = Weights(load_initializers(folder / "mtp.onnx"))
        cfg = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        layer_types = []
        for i in range(cfg["num_hidden_layers"]):
            linear = any(t.name == f"model.layers.{i}.linear_attn.dt_bias" for t in m.graph.initializer)
            layer_types.append("linear_attention" if linear else "full_attention")
        first_linear = layer_types.index("linear_attention")
        recurrent = next(i for i in m.graph.input if i.name == f"past.{first_linear}.recurrent")
        dims = [d.dim_value for d in recurrent.type.tensor_type.shape.dim][-3:]
        hv, dk, dv = dims
        qkv_rows = self.main.t[f"model.layers.{first_linear}.linear_attn.conv1d.weight"].shape[0]
        hk = (qkv_rows - hv * dv) // (2 * dk)
        self.shape = FolderShape(
            hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
            kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_size"], eps=1e-6, layer_types=layer_types,
            lin_k_heads=hk, lin_v_heads=hv, lin_dk=dk, lin_dv=dv,
            rotary_dim=2 * self.main.t["cos_cache"].shape[1],
        )

    # ------------------------------------------------------------------ blocks
    def _attention(self, w: Weights, prefix: str, h: np.ndarray, positions: np.ndarray) -> np.ndarray:
        s = self.shape
        seq = h.shape[0]
        hd, heads, kvh = s.head_dim, s.heads, s.kv_heads
        qkv = h @ w.proj(f"{prefix}.qkv_proj").T
        q_gate = qkv[:, : 2 * heads * hd].reshape(seq, heads, 2 * hd)
        q, gate = q_gate[..., :hd], q_gate[..., hd:].reshape(seq, heads * hd)
        k = qkv[:, 2 * heads * hd : 2 * heads * hd + kvh * hd].reshape(seq, kvh, hd)
        v = qkv[:, 2 * heads * hd + kvh * hd :].reshape(seq, kvh, hd)
        q = _rms(q, w[f"{prefix}.q_norm.layernorm.weight"], s.eps)
        k = _rms(k, w[f"{prefix}.k_norm.layernorm.weight"], s.eps)
        q, k = self._rope(w, q, positions), self._rope(w, k, positions)
        out = np.empty((seq, heads, hd))
        group = heads // kvh
        mask = np.triu(np.full((seq, seq), -np.inf), 1)
        for head in range(heads):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(hd) + mask
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, head // group]
        out = out.reshape(seq, heads * hd) * _sigmoid(gate)
        return out @ w.proj(f"{prefix}.o_proj").T

    def _rope(self, w: Weights, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        half = self.shape.rotary_dim // 2
        cos = w["cos_cache"][positions][:, None, :]
        sin = w["sin_cache"][positions][:, None, :]
        x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)

    def _linear_attention(self, w: Weights, prefix: str, h: np.ndarray) -> np.ndarray:
        s = self.shape
        seq = h.shape[0]
        hk, hv, dk, dv = s.lin_k_heads, s.lin_v_heads, s.lin_dk, s.lin_dv
        mixed = h @ w.proj(f"{prefix}.qkv_proj").T  # [S, C]
        z = h @ w.proj(f"{prefix}.z_proj").T
        b = h @ w.proj(f"{prefix}.b_proj").T
        a = h @ w.proj(f"{prefix}.a_proj").T
        kernel = w[f"{prefix}.conv1d.weight"][:, 0, :]  # [C, K]
        width = kernel.shape[1]
        padded = np.concatenate([np.zeros((width - 1, mixed.shape[1])), mixed], axis=0)
        conv = sum(padded[j : j + seq] * kernel[:, j] for j in range(width)) + w[f"{prefix}.conv1d.bias"]
        conv = _silu(conv)
        q = conv[:, : hk * dk].reshape(seq, hk, dk)
        k = conv[:, hk * dk : 2 * hk * dk].reshape(seq, hk, dk)
        v = conv[:, 2 * hk * dk :].reshape(seq, hv, dv)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        g = w[f"{prefix}.neg_exp_A"] * _softplus(a + w[f"{prefix}.dt_bias"])  # [S, Hv]
        beta = _sigmoid(b)
        out = np.empty((seq, hv, dv))
        group = hv // hk
        for head in range(hv):
            state = np.zeros((dk, dv))
            kh = head // group
            for t in range(seq):
                state *= np.exp(g[t, head])
                delta = (v[t, head] - k[t, kh] @ state) * beta[t, head]
                state += np.outer(k[t, kh], delta)
                out[t, head] = q[t, kh] @ state
        gate = z.reshape(seq, hv, dv)
        normed = _rms(out, w[f"{prefix}.norm.weight"], s.eps) * _silu(gate)
        return normed.reshape(seq, hv * dv) @ w.proj(f"{prefix}.out_proj").T

    def _mlp(self, w: Weights, prefix: str, h: np.ndarray) -> np.ndarray:
        gate = h @ w.proj(f"{prefix}.gate_proj").T
        up = h @ w.proj(f"{prefix}.up_proj").T
        return (_silu(gate) * up) @ w.proj(f"{prefix}.down_proj").T

    def _layer(self, w: Weights, i: int, kind: str, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        s = self.shape
        h = _rms(x, w[f"model.layers.{i}.input_layernorm.weight"], s.eps)
        if kind == "linear_attention":
            x = x + self._linear_attention(w, f"model.layers.{i}.linear_attn", h)
        else:
            x = x + self._attention(w, f"model.layers.{i}.attn", h, positions)
        h = _rms(x, w[f"model.layers.{i}.post_attention_layernorm.weight"], s.eps)
        return x + self._mlp(w, f"model.layers.{i}.mlp", h)

    # ------------------------------------------------------------------ public
    def forward(self, tokens) -> tuple[np.ndarray, np.ndarray]:
        """Target model over a whole sequence: (logits [S, V], final normed hidden [S, H])."""
        s, w = self.shape, self.main
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.arange(len(tokens))
        x = w["model.embed_tokens.weight"][tokens]
        for i, kind in enumerate(s.layer_types):
            x = self._layer(w, i, kind, x, positions)
        hidden = _rms(x, w[f"model.layers.{s.layers}.final_norm_layernorm.weight"], s.eps)
        return hidden @ w.proj("lm_head").T, hidden

    def mtp(self, tokens, hidden: np.ndarray, positions=None) -> tuple[np.ndarray, np.ndarray]:
        """MTP head over a sequence of (token t_{i+1}, target hidden h_i) pairs."""
        s, w = self.shape, self.head
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.arange(len(tokens)) if positions is None else np.asarray(positions)
        e = _rms(w["model.embed_tokens.weight"][tokens], w["model.mtp.pre_fc_norm_embedding.weight"], s.eps)
        h = _rms(np.asarray(hidden, np.float64), w["model.mtp.pre_fc_norm_hidden.weight"], s.eps)
        x = np.concatenate([e, h], axis=-1) @ w.proj("model.mtp.fc").T
        x = self._layer(w, 0, "full_attention", x, positions)
        out = _rms(x, w["model.layers.1.final_norm_layernorm.weight"], s.eps)
        return out @ w.proj("lm_head").T, out

    def greedy(self, prompt, new_tokens: int) -> list[int]:
        """Greedy continuation, recomputing the whole sequence for every token (no cache)."""
        tokens = list(prompt)
        for _ in range(new_tokens):
            logits, _ = self.forward(tokens)
            tokens.append(int(np.argmax(logits[-1])))
        return tokens[len(prompt):]
