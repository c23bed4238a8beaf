"""Synthetic weight generation, the tokenizer, and the acceptance knob."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from models.acceptance import measure_folder, periodic_from
from models.build import build
from models.config import PRESETS, BuildOptions, ConfigError, Synthesis, preset
from models.tokenizer import (
    BASE_VOCAB_SIZE,
    SPECIAL_TOKENS,
    load_base,
    special_ids,
    tokenizer_json_for_vocab,
    train_base_tokenizer,
)
from models.weights import NIBBLE_STD, Int4Matrix, _symmetric_nibbles, dequantize, ordered_map


def test_nibbles_are_symmetric_around_the_zero_point():
    raw = _symmetric_nibbles(np.random.default_rng(0), 1 << 20)
    nibbles = np.concatenate([raw & 0x0F, raw >> 4]).astype(np.int64) - 8
    counts = np.bincount(nibbles + 8, minlength=16)
    assert counts[0] == 0  # -8 never appears: values are -7..7
    assert abs(nibbles.mean()) < 0.01
    assert abs(nibbles.std() - NIBBLE_STD) < 0.01
    assert abs(counts[8] / counts[9] - 2) < 0.05  # 0 is twice as likely (nibble 0 was mapped to 8)


def test_int4_matrix_std_chunks_and_zero_rows():
    spec = Int4Matrix(n=300, k=256, std=0.05, zero_rows=(7, 299))
    parts = [spec.chunk(1, "w", i) for i in range(len(spec.chunk_ranges()))]
    packed = np.concatenate([p for p, _ in parts])
    scales = np.concatenate([s for _, s in parts])
    assert packed.shape == (300, 8, 16) and scales.shape == (300, 8)
    dense = dequantize(packed, scales)
    assert not dense[7].any() and not dense[299].any()
    assert abs(dense.std() - 0.05) < 0.003
    again = spec.chunk(1, "w", 0)
    assert np.array_equal(again[0], parts[0][0])  # chunks are reproducible alone
    assert not np.array_equal(Int4Matrix(n=300, k=256, std=0.05).chunk(2, "w", 0)[0], parts[0][0])


def test_mtp_fc_identity_half_is_exact():
    hidden = 96
    spec = Int4Matrix(n=hidden, k=2 * hidden, std=0.1 / math.sqrt(hidden), identity_half=True)
    packed, scales = spec.chunk(0, "fc", 0)
    dense = dequantize(packed, scales)
    np.testing.assert_allclose(dense[:, :hidden], np.eye(hidden), atol=3e-4)
    assert abs(dense[:, hidden:].std() * math.sqrt(hidden) - 0.1) < 0.01


def test_ordered_map_keeps_order_with_threads():
    with ThreadPoolExecutor(4) as pool:
        assert list(ordered_map(lambda i: i * i, 50, pool)) == [i * i for i in range(50)]
    assert list(ordered_map(lambda i: -i, 3, None)) == [0, -1, -2]


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_are_valid(name):
    shape = preset(name)
    shape.validate()
    assert shape.vocab_size >= BASE_VOCAB_SIZE
    assert sum(shape.mrope_section) == shape.rotary_dim // 2


def test_27b_preset_has_the_qwen35_27b_shapes():
    s = preset("qwen35-27b")
    assert (s.hidden_size, s.num_hidden_layers, s.intermediate_size, s.vocab_size) == (5120, 64, 17408, 248320)
    assert (s.num_attention_heads, s.num_key_value_heads, s.head_dim) == (24, 4, 256)
    assert (s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_conv_kernel_dim) == (16, 48, 128, 4)
    assert s.attention_layers == list(range(3, 64, 4))


def test_bad_shapes_and_options_are_named():
    with pytest.raises(ConfigError, match="multiple of"):
        PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "hidden_size": 100}).validate()
    with pytest.raises(ConfigError, match="mrope_section"):
        PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "mrope_section": (1, 1, 1)}).validate()
    with pytest.raises(ConfigError, match="state_window must be from 0 to 64"):
        BuildOptions(ep="cpu", state_window=-1).validate()
    with pytest.raises(ConfigError, match="got 65"):  # the op would refuse the folder at every load
        BuildOptions(ep="cuda", state_window=65).validate()
    BuildOptions(ep="cuda", state_window=64).validate()
    BuildOptions(ep="cpu", state_window=2).validate()  # a CPU folder with a window runs on our ops
    with pytest.raises(ConfigError, match="mtp_noise"):
        BuildOptions(synthesis=Synthesis(mtp_noise=-1)).validate()


def test_base_tokenizer_layout():
    base = load_base()
    ids = special_ids(base)
    assert ids.all == (BASE_VOCAB_SIZE - 3, BASE_VOCAB_SIZE - 2, BASE_VOCAB_SIZE - 1)
    assert [t["content"] for t in base["added_tokens"]] == list(SPECIAL_TOKENS)


def test_padded_tokenizer_decodes_every_id_and_encodes_like_the_base():
    from tokenizers import Tokenizer

    vocab = preset("qwen35-27b").vocab_size
    padded = Tokenizer.from_str(json.dumps(tokenizer_json_for_vocab(vocab)))
    base = Tokenizer.from_str(json.dumps(load_base()))
    assert padded.get_vocab_size() == vocab
    text = "def main(argv):\n    return sorted(set(argv))  # GNU General Public License <|im_end|>"
    assert padded.encode(text).ids == base.encode(text).ids
    ids = list(range(BASE_VOCAB_SIZE, vocab, 997)) + [vocab - 1]
    pieces = [padded.decode([i]) for i in ids]
    assert all(pieces) and len(set(pieces)) == len(pieces)
    assert len(set(padded.get_vocab())) == vocab  # no duplicate strings


def test_tokenizer_training_is_reproducible(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    a = train_base_tokenizer([corpus], vocab_size=300)
    b = train_base_tokenizer([corpus], vocab_size=300)
    assert a.to_str() == b.to_str()
    assert a.token_to_id("<|im_end|>") == a.get_vocab_size() - 1


@pytest.mark.parametrize("vocab", [BASE_VOCAB_SIZE, 248320])
def test_genai_tokenizer_agrees_with_tokenizers(tmp_path, vocab):
    """onnxruntime-genai's tokenizer reads our files as `tokenizers` does, padded or not."""
    og = pytest.importorskip("onnxruntime_genai")
    from tokenizers import Tokenizer

    build(preset("tiny"), tmp_path, BuildOptions())
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json_for_vocab(vocab)))
    ours = og.Tokenizer(og.Model(str(tmp_path)))
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in ("Hello, world!", "for i in range(10):\n\tprint(i ** 2)", "naïve café — 42",
                 "<|im_start|>user\nhi<|im_end|>"):
        ids = reference.encode(text).ids
        assert list(ours.encode(text)) == ids
    assert reference.encode("<|im_end|>").ids == [BASE_VOCAB_SIZE - 1]
    for ids in ([3202, 353, 11], [vocab - 1, vocab // 2, BASE_VOCAB_SIZE]):
        assert ours.decode(ids) == reference.decode(ids)


def test_periodic_tail_detection():
    assert periodic_from([1, 2, 3] + [7, 8] * 8) == 3
    assert periodic_from(list(range(40))) is None


def test_acceptance_follows_the_knob(tmp_path):
    """More noise on the head's hidden half -> fewer accepted drafts; no noise -> most accepted."""
    results = {}
    for noise in (0.0, 0.3, 2.0):
        folder = tmp_path / f"noise_{noise}"
        build(preset("tiny"), folder, BuildOptions(synthesis=Synthesis(mtp_noise=noise)))
        results[noise] = measure_folder(folder, prompts=3, prompt_length=16, new_tokens=32)
    assert all(r["finite"] for r in results.values())
    assert results[0.0]["acceptance"] > 0.8
    assert results[0.0]["acceptance"] > results[0.3]["acceptance"] > results[2.0]["acceptance"]
    assert results[2.0]["acceptance"] < 0.2
