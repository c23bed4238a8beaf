"""The tiles layout of ort_mtp::MatMulNBits (packing=1, ops.packing): the numpy packer against the op's
own byte map (the CPU kernel reads packed weights, so a packed model must give bit-identical outputs
to the unpacked one), pack_model's choices, and the op's checks of the attribute. The CUDA kernel for
the layout is checked on the device (bench/check_cuda_ops.py, group smoke-tiles)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from onnx import helper, numpy_helper

from ops import nbits, packing

NODE = "layers.0/mlp/up_proj"


def _weights(rng, K=512, N=48, block_size=32, dtype="float16", bias=True, zero_points=None):
    return nbits.random_weights(rng, K, N, bits=4, block_size=block_size, dtype=dtype, zero_points=zero_points,
                                bias=bias)


def _packed(w):
    return dataclasses.replace(w, b=packing.pack_b(w.b, w.N, w.K),
                               scales=packing.pack_scales(w.scales, w.N, w.K, w.block_size))


def _run(cpu_session, model, a):
    return cpu_session(model).run(None, {"A": a})[0]


@pytest.mark.parametrize("N,K", [(16, 256), (48, 512), (32, 1024)])
@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_pack_unpack_round_trip(N, K, block_size):
    rng = np.random.default_rng(N + K + block_size)
    b = rng.integers(0, 256, size=(N, K // block_size, block_size // 2), dtype=np.uint8)
    s = rng.integers(0, 2**16, size=(N, K // block_size), dtype=np.uint16)
    pb, ps = packing.pack_b(b, N, K), packing.pack_scales(s, N, K, block_size)
    assert pb.shape == b.shape and ps.shape == s.shape
    assert not np.array_equal(pb, b)  # the bytes do move; scales too, when a row has several chunks
    assert np.array_equal(ps, s) == (K == 256)
    assert np.array_equal(np.sort(ps, axis=None), np.sort(s, axis=None))  # scales only move
    assert np.array_equal(packing.unpack_b(pb, N, K), b)
    assert np.array_equal(packing.unpack_scales(ps, N, K, block_size), s)


@pytest.mark.parametrize("N,K", [(16, 256), (48, 512), (80, 1280)])
@pytest.mark.parametrize("block_size", [32, 64, 128])
@pytest.mark.parametrize("threads", [1, 3, 0])
def test_library_packer_writes_numpys_bytes(N, K, block_size, threads):
    """The library's packer (OrtMtpPackTiles) against the numpy statement of the layout, bitwise, on
    any thread count (the tiles are split between threads unevenly for N=80: 5 tiles on 3 threads)."""
    rng = np.random.default_rng(N * K + block_size)
    b = rng.integers(0, 256, size=(N, K // block_size, block_size // 2), dtype=np.uint8)
    s = rng.integers(0, 2**16, size=(N, K // block_size), dtype=np.uint16)
    pb, ps = packing.pack_tiles(N, K, block_size, b=b, scales=s, threads=threads)
    assert np.array_equal(pb, packing.pack_b(b, N, K)) and np.array_equal(ps, packing.pack_scales(s, N, K, block_size))
    out_b, out_s = np.zeros(b.size, np.uint8), np.zeros(s.size, np.uint16)  # into given buffers, B alone
    packing.pack_tiles(N, K, block_size, b=b, out_b=out_b, threads=threads)
    assert np.array_equal(out_b, pb.reshape(-1)) and not out_s.any()
    packing.pack_tiles(N, K, block_size, scales=s.view(np.float16), out_scales=out_s.view(np.float16))
    assert np.array_equal(out_s, ps.reshape(-1))


def test_library_packer_refuses_what_the_layout_does_not_take():
    b = np.zeros(16 * 256 // 2, np.uint8)
    with pytest.raises(ValueError, match="not a multiple of 256"):
        packing.pack_tiles(16, 128, 32, b=b[:1024])
    with pytest.raises(ValueError, match="has 100 values of 1 bytes where N=16, K=256, block_size=32 need 2048"):
        packing.pack_tiles(16, 256, 32, b=b[:100])
    with pytest.raises(ValueError, match="writeable C-contiguous"):
        packing.pack_tiles(16, 256, 32, b=b, out_b=np.zeros(4096, np.uint8)[::2])


def test_packed_word_holds_one_lanes_k_pairs():
    """Element (n, k) sits where matmul_nbits.h says: tile-chunk, word (j, lane, w), nibble order
    k 0,2,4,6,1,3,5,7. Checked on single nibbles so that a wrong axis cannot cancel out."""
    N, K = 32, 512
    for n, k in [(0, 0), (0, 1), (1, 9), (9, 37), (17, 300), (31, 511), (8, 255)]:
        q = np.zeros((N, K), np.uint8)
        q[n, k] = 0xA
        b = nbits.pack_bits(q, 4).reshape(N, K // 32, 16)
        flat = packing.pack_b(b, N, K).reshape(-1)
        byte = np.flatnonzero(flat)
        assert byte.size == 1
        T, r, c, kk = n // 16, n % 16, k // 256, k % 256
        u, t, e = kk // 32, (kk % 32) // 8, kk % 8
        j, lane, w = 2 * (u // 4) + r // 8, 4 * (r % 8) + t, u % 4
        pos = [0, 4, 1, 5, 2, 6, 3, 7][e]
        expected = (T * (K // 256) + c) * 2048 + 4 * (128 * j + 4 * lane + w) + pos // 2
        assert byte[0] == expected
        assert flat[byte[0]] == (0xA << (4 * (pos % 2)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_cpu_op_reads_the_packed_layout(cpu_session, dtype, block_size):
    """The op on packed weights (packing=1) is bit-identical to the op on the same weights unpacked."""
    rng = np.random.default_rng(block_size)
    w = _weights(rng, K=768, N=48, block_size=block_size, dtype=dtype)
    io32 = dtype == "bfloat16"  # numpy has no bfloat16: cast around the node
    a = rng.standard_normal((3, w.K)).astype(np.float32 if io32 else np.float16)
    plain = _run(cpu_session, nbits.single_node_model(w, domain="ort_mtp", float32_io=io32), a)
    tiles = _run(cpu_session, nbits.single_node_model(_packed(w), domain="ort_mtp", float32_io=io32, packing=1), a)
    assert np.array_equal(plain, tiles)
    wrong = _run(cpu_session, nbits.single_node_model(w, domain="ort_mtp", float32_io=io32, packing=1), a)
    assert not np.array_equal(plain, wrong)  # the attribute changes how the bytes are read


def test_pack_model_packs_what_the_layout_takes(cpu_session):
    rng = np.random.default_rng(3)
    w = _weights(rng, K=512, N=32)
    model = nbits.single_node_model(w, domain="ort_mtp", node_name=NODE)
    a = rng.standard_normal((2, w.K)).astype(np.float16)
    before = _run(cpu_session, model, a)
    assert packing.pack_model(model) == (1, [])
    attrs = {x.name: helper.get_attribute_value(x) for x in model.graph.node[0].attribute}
    assert attrs["packing"] == 1 and attrs["K"] == 512 and attrs["N"] == 32
    assert np.array_equal(_run(cpu_session, model, a), before)
    assert packing.pack_model(model) == (0, [])  # already packed: left alone


@pytest.mark.parametrize("activation", ["swiglu", None])
def test_pack_model_packs_both_weight_sets_of_a_two_weight_node(cpu_session, activation):
    """A gated MLP's swiglu node (and the two-output form) takes the layout for both of its sets: the
    outputs stay bit-identical, and each set's bytes are that set's packing."""
    rng = np.random.default_rng(6)
    gate, up = _weights(rng, K=512, N=32), _weights(rng, K=512, N=32 if activation else 48)
    model = nbits.single_node_model(gate, domain="ort_mtp", node_name=NODE, second=up, activation=activation)
    a = rng.standard_normal((3, gate.K)).astype(np.float16)
    before = cpu_session(model).run(None, {"A": a})
    assert packing.pack_model(model) == (1, [])
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for w, sfx in ((gate, ""), (up, "2")):
        want = _packed(w)
        assert np.array_equal(inits["B" + sfx], want.b) and np.array_equal(inits["scales" + sfx], want.scales)
    after = cpu_session(model).run(None, {"A": a})
    assert len(after) == len(before) and all(np.array_equal(x, y) for x, y in zip(after, before))


def test_pack_model_says_which_weight_set_keeps_a_pair_node_row_major():
    rng = np.random.default_rng(7)
    model = nbits.single_node_model(_weights(rng, K=512, N=32), domain="ort_mtp", node_name=NODE,
                                    second=_weights(rng, K=512, N=40))
    assert packing.pack_model(model) == (0, [(NODE, "weight set 2: N=40 is not a multiple of 16")])


@pytest.mark.parametrize("kwargs,reason", [
    (dict(K=500), "K=500 is not a multiple of 256"),
    (dict(N=40), "N=40 is not a multiple of 16"),
    (dict(block_size=16), "block_size=16"),
    (dict(zero_points="packed"), "zero points"),
    (dict(dtype="float32"), "float activations"),
])
def test_pack_model_says_why_it_skips_a_node(kwargs, reason):
    rng = np.random.default_rng(4)
    params = dict(K=512, N=32, block_size=32, dtype="float16", zero_points=None)
    params.update(kwargs)
    w = _weights(rng, **params)
    model = nbits.single_node_model(w, domain="ort_mtp", node_name=NODE)
    count, skipped = packing.pack_model(model)
    assert count == 0 and len(skipped) == 1
    assert skipped[0][0] == NODE and reason in skipped[0][1]


def test_pack_model_leaves_shared_weights_alone():
    rng = np.random.default_rng(5)
    model = nbits.single_node_model(_weights(rng, K=512, N=32), domain="ort_mtp", node_name=NODE)
    twin = helper.make_node("MatMulNBits", list(model.graph.node[0].input), ["Y2"], name="twin", domain="ort_mtp",
                            **{x.name: helper.get_attribute_value(x) for x in model.graph.node[0].attribute})
    model.graph.node.append(twin)
    count, skipped = packing.pack_model(model)
    assert count == 0 and {why for _, why in skipped} == {"B or scales is shared with another node"}


def _error(cpu_session, model) -> str:
    with pytest.raises(Exception) as info:
        cpu_session(model)
    return str(info.value)


@pytest.mark.parametrize("kwargs,packing_value,expected", [
    (dict(), 2, "attribute packing must be 0 (row-major) or 1 (tiles), got 2"),
    (dict(K=320), 1, "packing=1 (tiles) needs K a multiple of 256, got K=320"),
    (dict(N=24), 1, "packing=1 (tiles) needs N a multiple of 16, got N=24"),
    (dict(block_size=256), 1, "packing=1 (tiles) needs block_size 32, 64 or 128, got 256"),
    (dict(dtype="float32"), 1, "packing=1 (tiles) needs float16 or bfloat16 activations, got float"),
    (dict(zero_points="packed"), 1, "packing=1 (tiles) does not take zero_points"),
])
def test_op_checks_the_packing_attribute(cpu_session, kwargs, packing_value, expected):
    rng = np.random.default_rng(6)
    params = dict(K=512, N=32, block_size=32, dtype="float16", zero_points=None)
    params.update(kwargs)
    model = nbits.single_node_model(_weights(rng, **params), domain="ort_mtp", node_name=NODE, packing=packing_value)
    message = _error(cpu_session, model)
    assert f"MatMulNBits node '{NODE}'" in message and expected in message


def test_op_checks_bits_with_packing(cpu_session):
    rng = np.random.default_rng(7)
    w = nbits.random_weights(rng, 512, 32, bits=8, block_size=32, dtype="float16", zero_points=None, bias=False)
    message = _error(cpu_session, nbits.single_node_model(w, domain="ort_mtp", node_name=NODE, packing=1))
    assert "packing=1 (tiles) needs bits=4, got bits=8" in message


def test_readme_recipe_packs_a_model_with_external_data(cpu_session, tmp_path):
    """onnx.load (external data loaded), pack_model, save with external data: the README's recipe."""
    import onnx

    rng = np.random.default_rng(8)
    w = _weights(rng, K=512, N=32)
    source = tmp_path / "model_ort_mtp.onnx"
    onnx.save(nbits.single_node_model(w, domain="ort_mtp", node_name=NODE), str(source),
              save_as_external_data=True, location="model_ort_mtp.onnx.data", size_threshold=0)
    a = rng.standard_normal((2, w.K)).astype(np.float16)
    before = _run(cpu_session, source, a)
    model = onnx.load(str(source))
    assert packing.pack_model(model) == (1, [])
    target = tmp_path / "model_tiles.onnx"
    onnx.save(model, str(target), save_as_external_data=True, location="model_tiles.onnx.data", size_threshold=0)
    assert np.array_equal(_run(cpu_session, target, a), before)
    unloaded = onnx.load(str(source), load_external_data=False)
    count, skipped = packing.pack_model(unloaded)
    assert count == 0 and skipped == [(NODE, "B or scales is external data that was not loaded")]


def _two_node_model(rng):
    """fp16 A -> packable up (K=512, N=32) -> not packable down (K=32 ... N=48): ort_mtp nodes."""
    import onnx
    from onnx import TensorProto

    up = _weights(rng, K=512, N=32)
    down = _weights(rng, K=32, N=48, block_size=32, bias=False)
    inits, nodes = [], []
    for key, w, a, y in (("up", up, "A", "h"), ("down", down, "h", "Y")):
        inits += [nbits.tensor(f"{key}.B", w.b), nbits.tensor(f"{key}.scales", w.scales, "float16")]
        inputs = ["A" if a == "A" else a, f"{key}.B", f"{key}.scales"]
        if w.bias is not None:
            inits.append(nbits.tensor(f"{key}.bias", w.bias, "float16"))
            inputs += ["", "", f"{key}.bias"]
        nodes.append(helper.make_node("MatMulNBits", inputs, [y], name=f"/model/{key}/MatMul", domain="com.microsoft",
                                      K=w.K, N=w.N, bits=4, block_size=w.block_size))
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("A", TensorProto.FLOAT16, ["M", 512])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, ["M", 48])], initializer=inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid("com.microsoft", 1)])


def test_rewrite_pack_writes_packed_weights_beside_the_model(cpu_session, tmp_path):
    import hashlib

    import onnx

    from ops.rewrite import rewrite_file

    rng = np.random.default_rng(9)
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(_two_node_model(rng), str(src / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    digest = hashlib.sha256((src / "model.onnx.data").read_bytes()).hexdigest()
    out = tmp_path / "out"
    out.mkdir()
    plain = rewrite_file(src / "model.onnx", out / "plain.onnx")
    tiles = rewrite_file(src / "model.onnx", out / "tiles.onnx", pack=True)
    assert plain.model.packed == 0
    assert tiles.model.packed == 1
    assert tiles.model.not_packed == [("/model/down/MatMul", "K=32 is not a multiple of 256")]
    assert (out / "tiles.onnx.tiles.data").is_file()
    model = onnx.load(str(out / "tiles.onnx"), load_external_data=False)
    attrs = {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node}
    assert attrs["/model/up/MatMul"]["packing"] == 1 and "packing" not in attrs["/model/down/MatMul"]
    assert hashlib.sha256((src / "model.onnx.data").read_bytes()).hexdigest() == digest  # source untouched
    a = rng.standard_normal((3, 512)).astype(np.float16)
    assert np.array_equal(_run(cpu_session, out / "tiles.onnx", a), _run(cpu_session, out / "plain.onnx", a))


def test_rewrite_pack_cli(tmp_path, capsys):
    import onnx

    from ops.__main__ import main

    rng = np.random.default_rng(10)
    onnx.save(_two_node_model(rng), str(tmp_path / "model.onnx"))
    code = main(["rewrite", str(tmp_path / "model.onnx"), str(tmp_path / "tiles.onnx"), "--pack"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "model.onnx: packed 1 of 2 into the tiles layout" in out
    assert "1 left in MatMulNBits' layout: K=32 is not a multiple of 256" in out
    assert err == ""  # no progress bar where stderr is not a terminal
    again = main(["rewrite", str(tmp_path / "model.onnx"), str(tmp_path / "other.onnx"), "--pack"])
    assert again == 0  # embedded weights: no data file, nothing in the way


def test_rewrite_pack_shows_progress_on_a_terminal_stderr(tmp_path, capsys, terminal):
    import onnx

    from ops.__main__ import main

    err = terminal("stderr")
    onnx.save(_two_node_model(np.random.default_rng(10)), str(tmp_path / "model.onnx"))
    assert main(["rewrite", str(tmp_path / "model.onnx"), str(tmp_path / "tiles.onnx"), "--pack"]) == 0
    assert "packing model.onnx" in err.getvalue() and "/2 [" in err.getvalue(), err.getvalue()  # n of 2 nodes
    out = capsys.readouterr().out
    assert "packed 1 of 2" in out and "packing model.onnx" not in out  # stdout: the report alone


def test_rewrite_pack_packs_a_model_already_on_our_op(cpu_session, tmp_path):
    """--pack on a model that an earlier rewrite already put on ort_mtp: nothing to swap, but the
    nodes get packed (without --pack the CLI's require_rewrite still says there is nothing to do)."""
    import onnx

    from ops.rewrite import RewriteError, rewrite_file

    rng = np.random.default_rng(12)
    onnx.save(_two_node_model(rng), str(tmp_path / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    rewrite_file(tmp_path / "model.onnx", tmp_path / "ours.onnx")
    with pytest.raises(RewriteError, match="has no com.microsoft MatMulNBits node"):
        rewrite_file(tmp_path / "ours.onnx", tmp_path / "again.onnx", require_rewrite=True)
    report = rewrite_file(tmp_path / "ours.onnx", tmp_path / "tiles.onnx", require_rewrite=True, pack=True)
    assert report.model.count == 0 and report.model.packed == 1
    a = rng.standard_normal((2, 512)).astype(np.float16)
    assert np.array_equal(_run(cpu_session, tmp_path / "tiles.onnx", a), _run(cpu_session, tmp_path / "ours.onnx", a))


def test_packed_folder_generates_what_the_unpacked_one_does(tmp_path):
    """A tiny fp16 folder rewritten with and without --pack: the driver's greedy and MTP streams and
    onnxruntime-genai's greedy stream are the same tokens on both (the CPU op reads the packed
    layout exactly), and the source folder's weights are untouched."""
    import hashlib

    from driver import Generator
    from models.build import build
    from models.config import BuildOptions, preset
    from ops.rewrite import rewrite_folder

    src = tmp_path / "src"
    build(preset("tiny"), src, BuildOptions(precision="int4", ep="cuda"))  # int4 with fp16 activations
    digest = hashlib.sha256((src / "model.onnx.data").read_bytes()).hexdigest()
    plain, tiles = tmp_path / "plain", tmp_path / "tiles"
    rewrite_folder(src, plain)
    report = rewrite_folder(src, tiles, pack=True)
    # tiny: only the K=256 matmuls (down_proj, the head's) take the layout; K=128 ones are left.
    assert report.models["model.onnx"].packed == 8 and report.models["mtp.onnx"].packed >= 1
    assert {why for _, why in report.models["model.onnx"].not_packed} == {"K=128 is not a multiple of 256"}
    assert (tiles / "model.onnx.tiles.data").is_file() and not (plain / "model.onnx.tiles.data").exists()
    assert hashlib.sha256((src / "model.onnx.data").read_bytes()).hexdigest() == digest

    prompt = [5, 17, 300, 42, 7, 99]
    streams = {}
    for name, folder in (("plain", plain), ("tiles", tiles)):
        gen = Generator(folder, provider="cpu", mode="mtp", draft_tokens=3)
        streams[name] = (gen.generate(prompt, 12, mode="greedy", stop_at_eos=False).tokens,
                         gen.generate(prompt, 12, stop_at_eos=False).tokens)
    assert streams["tiles"] == streams["plain"]
    assert streams["plain"][0] == streams["plain"][1]  # MTP equals greedy

    og = pytest.importorskip("onnxruntime_genai")
    from genai_helpers import genai_greedy

    for folder in (plain, tiles):  # the CUDA folder's config, pointed at the CPU (as models build does for CPU)
        config = json.loads((folder / "genai_config.json").read_text())
        config["model"]["decoder"]["session_options"]["provider_options"] = []
        for section in ("decoder", "mtp"):
            config["model"][section].pop("shared_initializers", None)
        (folder / "genai_config.json").write_text(json.dumps(config))
    assert genai_greedy(og.Model(str(tiles)), prompt, 12) == genai_greedy(og.Model(str(plain)), prompt, 12)


def test_pack_model_refuses_external_data_outside_the_folder(tmp_path):
    import onnx

    rng = np.random.default_rng(13)
    model = nbits.single_node_model(_weights(rng, K=512, N=32), domain="ort_mtp", node_name=NODE)
    b = next(t for t in model.graph.initializer if t.name == "B")
    onnx.external_data_helper.set_external_data(b, "../elsewhere.bin", 0, len(b.raw_data))
    b.ClearField("raw_data")
    with pytest.raises(ValueError, match="not a relative path inside the model's folder"):
        packing.pack_model(model, packing.ExternalWeights(tmp_path, tmp_path / "m.onnx.tiles.data"))


def _unpackable_folder(tmp_path):
    """A genai folder whose up node claims N=48 while its B and scales hold 32 rows: the rewrite
    takes it (it does not read weights), packing cannot reshape B."""
    import onnx

    src = tmp_path / "src"
    src.mkdir()
    model = _two_node_model(np.random.default_rng(14))
    up = next(n for n in model.graph.node if n.name == "/model/up/MatMul")
    next(a for a in up.attribute if a.name == "N").i = 48
    onnx.save(model, str(src / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    config = {"model": {"decoder": {"filename": "model.onnx", "session_options": {}}, "type": "qwen3"}}
    (src / "genai_config.json").write_text(json.dumps(config))
    return src


def test_a_failed_pack_names_the_tensor_and_file_and_leaves_no_output(tmp_path, capsys):
    import os

    from ops.__main__ import main

    src = _unpackable_folder(tmp_path)
    out = tmp_path / "out"
    assert main(["rewrite", str(src), str(out), "--pack"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot pack ")
    for name in (str(src / "model.onnx"), "'/model/up/MatMul'", "N=48", "'up.B'", "model.onnx.data",
                 "has 8192 values of 1 bytes where N=48, K=512, block_size=32 need 12288"):
        assert name in err, name
    assert sorted(os.listdir(tmp_path)) == ["src"]  # no half folder, no staging folder
    # the single-file rewrite: neither the model, the linked data nor the packed weights are left
    files = tmp_path / "files"
    files.mkdir()
    assert main(["rewrite", str(src / "model.onnx"), str(files / "m.onnx"), "--pack"]) == 2
    assert "'up.B'" in capsys.readouterr().err and os.listdir(files) == []
    # the same output path takes a rerun (here without --pack, which reads no weight)
    assert main(["rewrite", str(src), str(out)]) == 0
    assert (out / "genai_config.json").is_file()


def test_an_interrupted_pack_leaves_no_output_and_the_same_command_then_works(tmp_path, monkeypatch):
    import os

    from models.build import build
    from models.config import BuildOptions, preset
    from ops.rewrite import rewrite_folder

    src = tmp_path / "src"
    build(preset("tiny"), src, BuildOptions(precision="int4", ep="cuda"), threads=1)
    out = tmp_path / "tiles"
    real_pack, calls = packing.pack_tiles, []

    def interrupted_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # two nodes packed, their weights in model.onnx.tiles.data
            raise KeyboardInterrupt
        return real_pack(*args, **kwargs)

    monkeypatch.setattr(packing, "pack_tiles", interrupted_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        rewrite_folder(src, out, pack=True)
    assert sorted(os.listdir(tmp_path)) == ["src"]
    monkeypatch.setattr(packing, "pack_tiles", real_pack)
    report = rewrite_folder(src, out, pack=True)
    assert report.models["model.onnx"].packed == 8 and (out / "model.onnx.tiles.data").is_file()
