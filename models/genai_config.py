"""genai_config.json with the fields, key order and mtp section of onnxruntime-genai 0.18's builder
(builders/base.py make_genai_config, builders/qwen.py add_mtp_to_genai_config)."""

from __future__ import annotations

from .config import BuildOptions, Qwen35Shape
from .onnx_writer import DTYPES, ExternalData
from .tokenizer import SpecialIds

# The tensors the builder's share_initializers finds identical in model.onnx.data and mtp.onnx.data.
SHARED_PREFIXES = ("lm_head.MatMul.",)
SHARED_NAMES = ("model.embed_tokens.weight",)


def shared_initializer_entries(data: ExternalData, shapes: dict[str, tuple[str, list[int]]]) -> list[dict]:
    """The builder's shared_initializers list: where each shared tensor lives in model.onnx.data."""
    entries = []
    for name, (dtype, shape) in shapes.items():
        offset, length = data.locations[name]
        entries.append(
            {
                "name": name,
                "data_file": data.filename,
                "offset": str(offset),
                "length": str(length),
                "data_type": int(DTYPES[dtype][1]),
                "shape": list(shape),
            }
        )
    return entries


def make_genai_config(
    shape: Qwen35Shape, options: BuildOptions, specials: SpecialIds, shared: list[dict]
) -> dict:
    inputs = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
        "past_conv_names": "past.%d.conv",
        "past_recurrent_names": "past.%d.recurrent",
    }
    outputs = {
        "logits": "logits",
        "present_key_names": "present.%d.key",
        "present_value_names": "present.%d.value",
        "present_conv_names": "present.%d.conv",
        "present_recurrent_names": "present.%d.recurrent",
        "hidden_states": "hidden_states",
    }
    provider_options = [{"cuda": {"enable_cuda_graph": "0"}}] if options.ep == "cuda" else []
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": provider_options},
        "filename": "model.onnx",
        "head_size": shape.head_dim,
        "hidden_size": shape.hidden_size,
        "inputs": inputs,
        "outputs": outputs,
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
    }
    mtp = {
        "enabled": True,
        "filename": "mtp.onnx",
        "num_hidden_layers": 1,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_size": shape.head_dim,
        "main_hidden_states": "hidden_states",
        "inputs": {
            "input_ids": "input_ids",
            "hidden_states": "hidden_states",
            "attention_mask": "attention_mask",
            "position_ids": "position_ids",
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
        },
        "outputs": {
            "logits": "logits",
            "hidden_states": "hidden_states_out",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
    }
    if shared and options.shares_initializers:
        decoder["shared_initializers"] = shared
        mtp["shared_initializers"] = shared
    return {
        "model": {
            "bos_token_id": specials.endoftext,
            "context_length": shape.context_length,
            "decoder": decoder,
            # Qwen3.5 ends a turn with <|im_end|> and a document with <|endoftext|>
            "eos_token_id": [specials.im_end, specials.endoftext],
            "pad_token_id": specials.endoftext,
            "type": "qwen3_5_text",
            "vocab_size": shape.vocab_size,
            "mtp": mtp,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": shape.context_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }
