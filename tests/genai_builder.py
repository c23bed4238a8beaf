"""onnxruntime-genai's own builder on a tiny random Qwen3.5 checkpoint: "a folder built by
onnxruntime-genai's builder", which the driver must run as it is (the fixtures in conftest.py; also
`bench/driver_cuda_check.py prepare`).

The checkpoint is transformers' Qwen3_5ForConditionalGeneration with MTP weights added as `mtp.*`
tensors. Its weights use the construction that makes an MTP head predictive on random weights: every
layer's output projections scaled by 0.02 (the residual stream stays near the token embedding), and
the head's fc = [identity on the embedding half | N(0, 0.1/sqrt(H)) on the hidden half].
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

HIDDEN = 64


def make_checkpoint(out: Path, seed: int = 0, layer_types: list[str] | None = None) -> Path:
    """A tiny random Qwen3.5 checkpoint with an MTP layer and a BPE tokenizer trained on stdlib text.
    layer_types: the 4 layers' kinds (default Qwen3.5's: three linear_attention, then full_attention)."""
    torch = pytest.importorskip("torch", reason="building a Hugging Face checkpoint needs torch")
    transformers = pytest.importorskip("transformers", reason="building a Hugging Face checkpoint needs transformers")
    import safetensors.torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    out.mkdir(parents=True, exist_ok=True)
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:40]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                         pad_token="<|endoftext|>").save_pretrained(out)
    torch.manual_seed(seed)
    text = dict(vocab_size=tok.get_vocab_size(), hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
                linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                max_position_embeddings=256, mtp_num_hidden_layers=1, eos_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    if layer_types is not None:
        text["layer_types"] = layer_types
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": HIDDEN}
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for k in state:
        if any(s in k for s in ("o_proj", "down_proj", "out_proj")) and "visual" not in k:
            state[k] *= 0.02
    head_config = transformers.Qwen3_5Config(
        text_config=dict(text, num_hidden_layers=1, layer_types=["full_attention"])).text_config
    for k, v in Qwen3_5DecoderLayer(head_config, layer_idx=0).state_dict().items():
        v = v.detach().clone()
        if v.dim() >= 2:
            v = torch.randn_like(v) / v.shape[-1] ** 0.5
        if any(s in k for s in ("o_proj", "down_proj")):
            v *= 0.02
        state["mtp.layers.0." + k] = v
    state["mtp.fc.weight"] = torch.cat([torch.eye(HIDDEN), torch.randn(HIDDEN, HIDDEN) * 0.1 / HIDDEN ** 0.5], dim=1)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        state[f"mtp.{name}.weight"] = torch.zeros(HIDDEN)  # Qwen3.5 norms scale by (1 + weight)
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
                                metadata={"format": "pt"})
    config.save_pretrained(out)
    return out


def run_genai_builder(checkpoint: Path, out: Path, ep: str = "cpu", extra: str | None = None) -> Path:
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai's builder makes this folder")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out),
           "-p", "int4", "-e", ep, "-c", str(out.parent / "cache")]
    if extra:
        cmd += ["--extra_options", extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "genai_config.json").is_file():
        raise RuntimeError(f"onnxruntime-genai's builder failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return out
