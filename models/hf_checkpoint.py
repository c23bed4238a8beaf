"""A random Hugging Face Qwen3.5 checkpoint (with MTP weights) of a given shape, for running
onnxruntime-genai's own builder: the reference our graphs are compared with, and the input of the
`convert` tests. Needs torch and transformers (test-only dependencies)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

from .config import Qwen35Shape
from .tokenizer import write_tokenizer_files


def text_config_dict(shape: Qwen35Shape, specials) -> dict:
    return dict(
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        linear_num_key_heads=shape.linear_num_key_heads,
        linear_num_value_heads=shape.linear_num_value_heads,
        linear_key_head_dim=shape.linear_key_head_dim,
        linear_value_head_dim=shape.linear_value_head_dim,
        linear_conv_kernel_dim=shape.linear_conv_kernel_dim,
        vocab_size=shape.vocab_size,
        max_position_embeddings=shape.context_length,
        rms_norm_eps=shape.rms_norm_eps,
        layer_types=shape.layer_types,
        mtp_num_hidden_layers=1,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": shape.rope_theta,
            "partial_rotary_factor": shape.partial_rotary_factor,
            "mrope_section": list(shape.mrope_section),
            "mrope_interleaved": True,
        },
        tie_word_embeddings=False,
        bos_token_id=specials.endoftext,
        eos_token_id=[specials.im_end, specials.endoftext],
        pad_token_id=specials.endoftext,
    )


def make_checkpoint(shape: Qwen35Shape, out: str | os.PathLike, seed: int = 0) -> Path:
    """Writes config.json, model.safetensors (random Qwen3_5ForConditionalGeneration with a
    one-block vision tower), mtp.safetensors (mtp.* tensors, as real Qwen3.5 checkpoints ship them)
    and this package's tokenizer files."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specials = write_tokenizer_files(out, shape.vocab_size, shape.context_length)
    text = text_config_dict(shape, specials)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=shape.hidden_size)
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    model.save_pretrained(out)

    layer_config = copy.deepcopy(config.text_config)
    layer_config.layer_types = ["full_attention"]
    layer_config.num_hidden_layers = 1
    layer = Qwen3_5DecoderLayer(layer_config, 0)
    hidden = shape.hidden_size
    mtp = {f"mtp.layers.0.{k}": v.detach().clone() for k, v in layer.state_dict().items()}
    mtp["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden) * 0.02
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = torch.zeros(hidden)
    save_file({k: v.contiguous() for k, v in mtp.items()}, str(out / "mtp.safetensors"))
    return out
