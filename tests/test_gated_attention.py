"""ort_mtp::GatedAttention on the CPU EP (csrc/attention/gated_attention.cc) and its rewrite
(ops/gated_attention.py): against the float64 reference of its definition, against the builder's sixteen
nodes run by ONNX Runtime, a width-S call against S width-1 calls bit for bit (outputs and cache), what
the rewrite fuses and what it keeps, and the errors a bad node or input gets.

Tolerances: float32 steps are rounded to float32 where a graph node would write a tensor (the normed and
rotated q and k), so against float64 the output moves by a few float32 ulps of the values that feed the
softmax, times the attention's condition; 2e-5 absolute + 2e-5 relative covers it on these unit-scale
inputs with margin (about a hundred float32 ulps of the output). float16 rounds q, k, the attention and the
gated output to float16: 2e-2, a few dozen float16 ulps. Against ONNX Runtime's nodes (MLAS rotary with its
own float arithmetic, float32 norms) the float32 bound is the same.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import ops.gated_attention as ga
from ops.rewrite import ATTENTION, GATED_ATTENTION, gated_attention_check, rewrite_model_report

TOL = {"float32": (2e-5, 2e-5), "float16": (2e-2, 2e-2)}
CONFIGS = [
    ga.GatedAttentionConfig(),
    ga.GatedAttentionConfig(num_heads=4, kv_num_heads=1, head_size=32, rotary_dim=32, mrope_section=(8, 4, 4),
                            mrope_layout=0),
    ga.GatedAttentionConfig(num_heads=2, kv_num_heads=2, head_size=8, rotary_dim=0, mrope_section=(2, 1, 1)),
    ga.GatedAttentionConfig(dtype="float16"),
]


def _id(cfg):
    return f"{cfg.dtype}-q{cfg.num_heads}-kv{cfg.kv_num_heads}-h{cfg.head_size}-rot{cfg.rotary_dim}-layout{cfg.mrope_layout}"


def _close(got, want, dtype, what):
    atol, rtol = TOL[dtype]
    err = np.abs(np.asarray(got, np.float64) - want)
    assert np.all(err <= atol + rtol * np.abs(want)), f"{what}: max error {err.max():.3g}"


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_matches_the_float64_definition(cfg, cpu_session):
    rng = np.random.default_rng(1)
    feed = ga.random_case(rng, cfg, batch=2, seq=3, past=5, buffer=12)
    out, pk, pv = cpu_session(ga.model(cfg)).run(None, feed)
    want = ga.reference(cfg, **feed)
    _close(out, want[0], cfg.dtype, "output")
    _close(pk, want[1], cfg.dtype, "present_key")
    _close(pv, want[2], cfg.dtype, "present_value")
    assert np.abs(want[0]).max() > 0.1  # the gate and attention leave something to compare


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c.dtype == "float32"], ids=_id)
def test_matches_the_builders_nodes(cfg, cpu_session):
    """The sixteen nodes (ORT's SimplifiedLayerNormalization and MRotaryEmbedding, our attention) and
    the one node agree within float32 rounding."""
    rng = np.random.default_rng(2)
    feed = ga.random_case(rng, cfg, batch=1, seq=4, past=6, buffer=16)
    fused = cpu_session(ga.model(cfg)).run(None, feed)
    nodes = cpu_session(ga.builder_model(cfg)).run(None, feed)
    for got, want, name in zip(fused, nodes, ga.OUTPUTS):
        _close(got, np.asarray(want, np.float64), cfg.dtype, name)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_a_wide_call_is_width_1_calls_bit_for_bit(cfg, threads, cpu_session):
    """Width S from a cache of `past` tokens = S width-1 calls, each fed the previous call's present:
    the same output rows and the same cache, bit for bit."""
    rng = np.random.default_rng(3)
    S, past, buffer = 5, 4, 12
    feed = ga.random_case(rng, cfg, batch=1, seq=S, past=past, buffer=buffer)
    session = cpu_session(ga.model(cfg), threads=threads)
    wide = session.run(None, feed)
    cache = (feed["past_key"], feed["past_value"])
    for s in range(S):
        step = dict(feed, qkv=feed["qkv"][:, s:s + 1], position_ids=feed["position_ids"][:, :, s:s + 1],
                    past_key=cache[0], past_value=cache[1], seqlens_k=np.array([past + s], np.int32),
                    total_sequence_length=np.array(past + s + 1, np.int32))
        out, pk, pv = session.run(None, step)
        assert np.array_equal(out.view(np.uint8), wide[0][:, s:s + 1].view(np.uint8)), f"row {s}"
        cache = (pk, pv)
    assert np.array_equal(cache[0][:, :, :past + S], wide[1][:, :, :past + S])
    assert np.array_equal(cache[1][:, :, :past + S], wide[2][:, :, :past + S])


@pytest.mark.parametrize("commuted", [False, True], ids=["as-built", "commuted-gate-mul"])
def test_the_rewrite_fuses_the_builders_nodes(commuted, cpu_session):
    cfg = ga.GatedAttentionConfig()
    model = ga.builder_model(cfg)
    if commuted:
        mul = model.graph.node[-1]
        mul.input[:] = list(reversed(mul.input))
    original = onnx.ModelProto.FromString(model.SerializeToString())
    report = rewrite_model_report(model, rewrites=[GATED_ATTENTION], gated_attention=gated_attention_check())
    assert report.gated_attention.rewritten == ["/model/layers.3/attn/GroupQueryAttention"]
    (node,) = model.graph.node
    assert (node.domain, node.op_type, node.name) == ("ort_mtp", "GatedAttention", "/model/layers.3/attn/GatedAttention")
    assert list(node.input) == list(ga.INPUTS) and list(node.output) == list(ga.OUTPUTS)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["mrope_section"] == [2, 1, 1] and attrs["rotary_embedding_dim"] == 8 and attrs["mrope_layout"] == 1
    assert abs(attrs["epsilon"] - cfg.epsilon) < 1e-12 and attrs["num_heads"] == 4 and attrs["kv_num_heads"] == 2
    feed = ga.random_case(np.random.default_rng(4), cfg, batch=1, seq=2, past=3, buffer=8)
    for got, want in zip(cpu_session(model).run(None, feed), cpu_session(original).run(None, feed)):
        _close(got, np.asarray(want, np.float64), "float32", "rewritten vs nodes")


def test_the_rewrite_fuses_a_16_bit_mixer_with_casts_around_the_rotary(cpu_session):
    """A float16 graph runs each rotary in float32 between casts (twenty nodes): fused too, and the one
    node computes what they do within float16 rounding (the op rounds where the casts round)."""
    cfg = ga.GatedAttentionConfig(dtype="float16")
    model = ga.builder_model(cfg)
    assert sum(n.op_type == "Cast" for n in model.graph.node) == 4
    original = onnx.ModelProto.FromString(model.SerializeToString())
    report = rewrite_model_report(model, rewrites=[GATED_ATTENTION], gated_attention=gated_attention_check())
    assert len(report.gated_attention.rewritten) == 1 and [n.op_type for n in model.graph.node] == ["GatedAttention"]
    feed = ga.random_case(np.random.default_rng(6), cfg, batch=1, seq=3, past=4, buffer=9)
    for got, want in zip(cpu_session(model).run(None, feed), cpu_session(original).run(None, feed)):
        _close(got, np.asarray(want, np.float64), "float16", "rewritten vs nodes")


def test_casts_to_another_type_are_kept():
    model = ga.builder_model(ga.GatedAttentionConfig(dtype="float16"))
    cast = next(n for n in model.graph.node if n.name.endswith("k_rotary/Cast_in"))
    cast.attribute[0].i = onnx.TensorProto.DOUBLE
    report = rewrite_model_report(model, rewrites=[GATED_ATTENTION], gated_attention=gated_attention_check())
    assert report.gated_attention.rewritten == []
    assert "casts around the rotary are not to float32" in report.gated_attention.kept[0][1]


def _edit(model, name, **attrs):
    node = next(n for n in model.graph.node if n.name.endswith(name))
    for key, value in attrs.items():
        for i, a in enumerate(node.attribute):
            if a.name == key:
                del node.attribute[i]
                break
        node.attribute.append(helper.make_attribute(key, value))
    return model


def _add_output(model, name):
    model.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return model


@pytest.mark.parametrize("edit,reason", [
    (lambda m: _edit(m, "k_norm/SimplifiedLayerNormalization", epsilon=1e-5), "differs from the q norm's"),
    (lambda m: _edit(m, "q_rotary/MRotaryEmbedding", interleaved=1), "interleaved=1 is not supported"),
    (lambda m: _edit(m, "k_rotary/MRotaryEmbedding", mrope_layout=0), "rotary attributes differ"),
    (lambda m: _add_output(m, "q_rot"),
     "q_rot (an output of /model/layers.3/attn/q_rotary/MRotaryEmbedding, inside the block) is a graph output"),
])
def test_mixers_that_do_not_fit_are_kept_with_the_reason(edit, reason):
    model = edit(ga.builder_model(ga.GatedAttentionConfig()))
    report = rewrite_model_report(model, rewrites=[GATED_ATTENTION], gated_attention=gated_attention_check())
    assert report.gated_attention.rewritten == [] and len(report.gated_attention.kept) == 1
    assert reason in report.gated_attention.kept[0][1], report.gated_attention.kept[0][1]
    assert len(model.graph.node) == 16


def test_com_microsoft_attention_is_left_to_the_attention_rewrite(library_path):
    model = ga.builder_model(ga.GatedAttentionConfig(), gqa_domain="com.microsoft")
    alone = onnx.ModelProto.FromString(model.SerializeToString())
    assert rewrite_model_report(alone, rewrites=[GATED_ATTENTION], gated_attention=gated_attention_check()).changed is False
    from ops.rewrite import attention_check

    report = rewrite_model_report(model, rewrites=[ATTENTION, GATED_ATTENTION], attention=attention_check(),
                                  gated_attention=gated_attention_check())
    assert len(report.gated_attention.rewritten) == 1 and len(model.graph.node) == 1


def test_tiny_preset_fuses_every_attention_layer(tiny_folder):
    from ops.rewrite import attention_check

    model = onnx.load(str(tiny_folder / "model.onnx"), load_external_data=False)
    layers = sum(1 for n in model.graph.node if n.op_type == "GroupQueryAttention")
    report = rewrite_model_report(model, rewrites=[ATTENTION, GATED_ATTENTION], attention=attention_check(),
                                  gated_attention=gated_attention_check(), base_dir=tiny_folder)
    assert layers == 2 and len(report.gated_attention.rewritten) == layers and report.gated_attention.kept == []
    assert not any(n.op_type in ("MRotaryEmbedding", "GroupQueryAttention") for n in model.graph.node)


def _refusal(cpu_session, model, feed=None) -> str:
    with pytest.raises(Exception) as e:
        session = cpu_session(model)
        session.run(None, feed)
    return str(e.value)


def test_errors_name_what_is_wrong(cpu_session):
    cfg = ga.GatedAttentionConfig()
    feed = ga.random_case(np.random.default_rng(5), cfg, batch=1, seq=2, past=3, buffer=8)
    node_errors = [
        (dict(cfg.attributes(), mrope_section=[2, 1]), "mrope_section must hold 3 values"),
        (dict(cfg.attributes(), interleaved=1), "interleaved=1"),
        ({k: v for k, v in cfg.attributes().items() if k != "mrope_section"}, "missing required attribute 'mrope_section'"),
        (dict(cfg.attributes(), rotary_embedding_dim=7), "rotary_embedding_dim must be even"),
        (dict(cfg.attributes(), mrope_section=[2, 2, 2]), "mrope_section sums to 6, not rotary_embedding_dim / 2 = 4"),
        (dict(cfg.attributes(), rotary_embedding_dim=32), "rotary_embedding_dim 32 exceeds the head size 16"),
    ]
    for attrs, needle in node_errors:
        message = _refusal(cpu_session, ga.model(cfg, attributes=attrs), feed)
        assert needle in message and "GatedAttention node" in message, message
    input_errors = [
        (dict(feed, qkv=feed["qkv"][..., :-1]), "input qkv has shape [1, 2, 191]"),
        (dict(feed, position_ids=feed["position_ids"] + 100), "outside the cos/sin caches' [0, 64)"),
        (dict(feed, sin_cache=feed["sin_cache"][:10]), "input sin_cache has shape [10, 4], cos_cache [64, 4]"),
        (dict(feed, seqlens_k=np.array([20], np.int32)), "past the end of the KV cache"),
        (dict(feed, q_norm_weight=feed["q_norm_weight"][:8]), "input q_norm_weight has shape [8]"),
    ]
    session = cpu_session(ga.model(cfg))
    for bad, needle in input_errors:
        with pytest.raises(Exception) as e:
            session.run(None, bad)
        assert needle in str(e.value), str(e.value)
