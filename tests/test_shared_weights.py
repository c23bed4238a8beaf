"""driver.shared_weights: the MTP head's session reads the main session's copy of the initializers both
graphs hold the same (the embedding and lm_head), checked byte for byte, and ONNX Runtime really reads
that one copy in place (a change to it shows in both sessions' outputs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from driver import Generator
from driver.errors import DriverError
from driver.device import CpuDevice, make_device
from driver.shared_weights import MIN_SHARED_BYTES, SharedWeights, initializer_bytes, shareable_names

ROWS, COLS = 1024, 512  # float32: 2 MiB, above MIN_SHARED_BYTES


def _embedding(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype(np.float32)


def _point(t: TensorProto, location: str, offset: int, length: int) -> None:
    """Records t's bytes as `length` bytes at `offset` of the external data file `location`."""
    del t.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=key, value=value)
    t.data_location = TensorProto.EXTERNAL


def _gather_graph(folder: Path, data_file: str, table: np.ndarray, name: str = "E") -> onnx.ModelProto:
    """ids -> table[ids], the table stored as external data in folder/data_file (as a model folder's)."""
    (folder / data_file).write_bytes(b"\0" * 64 + table.tobytes())  # at an offset, as real data files do
    t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(table.dtype), dims=table.shape)
    _point(t, data_file, 64, table.nbytes)
    graph = helper.make_graph(
        [helper.make_node("Gather", [name, "ids"], ["y"])], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("y", t.data_type, [None, table.shape[1]])], [t])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])


def _session(proto: onnx.ModelProto, folder: Path, shared: SharedWeights) -> tuple[ort.InferenceSession, set]:
    options = ort.SessionOptions()
    given = shared.add_to(options, proto, folder)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"]), given


IDS = np.array([3, 1000, 7], np.int64)


def test_one_copy_serves_both_sessions(tmp_path):
    table = _embedding(0)
    main, head = _gather_graph(tmp_path, "model.onnx.data", table), _gather_graph(tmp_path, "mtp.onnx.data", table)
    shared = SharedWeights(make_device("cpu"), shareable_names(main, head))
    first, given_first = _session(main, tmp_path, shared)
    second, given_second = _session(head, tmp_path, shared)
    assert given_first == given_second == {"E"} and shared.reused == {"E": table.nbytes}
    for s in (first, second):
        np.testing.assert_array_equal(s.run(None, {"ids": IDS})[0], table[IDS])
    # ORT reads the copy in place: a change to it is what both sessions return (no private copies).
    copy = shared._copies["E"].array
    copy[IDS] = -1.0
    for s in (first, second):
        assert (s.run(None, {"ids": IDS})[0] == -1.0).all()


def test_different_bytes_are_not_shared(tmp_path):
    table, other = _embedding(0), _embedding(0)
    other[ROWS - 1, COLS - 1] += 1.0  # one element, at the very end
    main, head = _gather_graph(tmp_path, "model.onnx.data", table), _gather_graph(tmp_path, "mtp.onnx.data", other)
    shared = SharedWeights(make_device("cpu"), shareable_names(main, head))
    _session(main, tmp_path, shared)
    second, given = _session(head, tmp_path, shared)
    assert given == set() and shared.reused == {}
    last = np.array([ROWS - 1], np.int64)
    np.testing.assert_array_equal(second.run(None, {"ids": last})[0], other[last])


def test_candidates_need_the_same_type_and_shape_and_size(tmp_path):
    table = _embedding(0)
    main = _gather_graph(tmp_path, "a.data", table)
    assert shareable_names(main, _gather_graph(tmp_path, "b.data", table.astype(np.float16))) == set()
    assert shareable_names(main, _gather_graph(tmp_path, "c.data", table[: ROWS // 2])) == set()
    assert shareable_names(main, _gather_graph(tmp_path, "d.data", table, name="F")) == set()
    small = np.zeros((MIN_SHARED_BYTES // 8, 1), np.float32)
    assert shareable_names(_gather_graph(tmp_path, "e.data", small), _gather_graph(tmp_path, "f.data", small)) == set()


def test_unreadable_external_data_is_left_to_onnx_runtime(tmp_path):
    table = _embedding(0)
    proto = _gather_graph(tmp_path, "model.onnx.data", table)
    t = proto.graph.initializer[0]
    assert initializer_bytes(t, tmp_path) is not None
    (tmp_path / "a-folder").mkdir()
    for location in ("../model.onnx.data", str(tmp_path / "model.onnx.data"), "missing.data", "a-folder", ""):
        _point(t, location, 64, table.nbytes)
        assert initializer_bytes(t, tmp_path) is None, location
    for offset in ("-64", "abc"):  # read_folder refuses these; nothing here fails on them either
        _point(t, "model.onnx.data", 0, table.nbytes)
        t.external_data[1].value = offset
        assert initializer_bytes(t, tmp_path) is None, offset
    _point(t, "model.onnx.data", 128, table.nbytes)  # runs past the end of the file
    assert initializer_bytes(t, tmp_path) is None
    shared = SharedWeights(make_device("cpu"), {"E"})
    assert shared.add_to(ort.SessionOptions(), proto, tmp_path) == set()


def test_packed_bytes_are_what_is_compared_and_shared(tmp_path):
    """A tensor the tiles layout replaced is shared in its packed form, and only with a session whose
    bytes are the same packed ones."""
    table = _embedding(0)
    main, head = _gather_graph(tmp_path, "model.onnx.data", table), _gather_graph(tmp_path, "mtp.onnx.data", table)
    packed = {"E": _embedding(1)}
    shared = SharedWeights(make_device("cpu"), shareable_names(main, head))
    assert shared.add_to(ort.SessionOptions(), main, tmp_path, packed) == {"E"}
    np.testing.assert_array_equal(shared._copies["E"].array, packed["E"])
    assert shared.add_to(ort.SessionOptions(), head, tmp_path) == set()  # the folder's bytes: not the packed ones
    assert shared.add_to(ort.SessionOptions(), head, tmp_path, packed) == {"E"}


def test_mtp_generator_loads_embedding_and_lm_head_once(tiny_folder, monkeypatch):
    """The tiny folder's head reads the main graph's embedding and lm_head: where the device shares
    weights (CUDA; forced here on the CPU, whose sessions run the same path) the head's session takes the
    main session's copies of every one of them large enough to share, and MTP still prints greedy's tokens."""
    monkeypatch.setattr(CpuDevice, "shares_weights", True)
    gen = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=2, max_length=96, threads=1)
    head = onnx.load(tiny_folder / "mtp.onnx", load_external_data=False)
    main = onnx.load(tiny_folder / "model.onnx", load_external_data=False)
    main_bytes = {t.name: t for t in main.graph.initializer}
    expected = {}
    for t in head.graph.initializer:
        mine, theirs = initializer_bytes(t, tiny_folder), None
        if t.name in main_bytes and mine is not None:
            theirs = initializer_bytes(main_bytes[t.name], tiny_folder)
        if theirs is not None and theirs.shape == mine.shape and np.array_equal(theirs, mine):
            expected[t.name] = mine.nbytes
    assert "model.embed_tokens.weight" in expected
    assert gen.shared_weights.reused == expected
    greedy = Generator(tiny_folder, provider="cpu", mode="greedy", max_length=96, threads=1)
    prompt = [5, 17, 300, 42, 7, 99]
    assert (gen.generate(prompt, 24, stop_at_eos=False).tokens
            == greedy.generate(prompt, 24, stop_at_eos=False).tokens)


def test_cpu_generators_leave_sharing_to_onnx_runtime(tiny_folder):
    """On the CPU ORT maps the data files, so both sessions already read the same pages: no copy of ours."""
    gen = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=2, max_length=96, threads=1)
    assert gen.shared_weights is None


def test_a_tensor_a_kernel_may_pre_pack_is_left_to_onnx_runtime(tmp_path):
    """ORT's MatMul pre-packs its constant B and lets ORT drop the initializer: a copy of ours would be
    held on top of its packed one, so a tensor with such a consumer (here beside a Gather) is not shared."""
    table = _embedding(0)
    proto = _gather_graph(tmp_path, "model.onnx.data", table)
    proto.graph.node.append(helper.make_node("MatMul", ["x", "E"], ["z"]))
    proto.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS]))
    proto.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, COLS]))
    shared = SharedWeights(make_device("cpu"), {"E"})
    assert shared.add_to(ort.SessionOptions(), proto, tmp_path) == set()
    del proto.graph.node[-1]
    assert shared.add_to(ort.SessionOptions(), proto, tmp_path) == {"E"}


def test_two_graphs_naming_the_same_bytes_share_them(tmp_path):
    """mtp.onnx points into model.onnx.data (shared_initializers): the same place needs no comparison,
    and a tiles-packed copy elsewhere is still compared."""
    table = _embedding(0)
    main = _gather_graph(tmp_path, "model.onnx.data", table)
    head = onnx.ModelProto()
    head.CopyFrom(main)
    shared = SharedWeights(make_device("cpu"), shareable_names(main, head))
    assert shared.add_to(ort.SessionOptions(), main, tmp_path) == {"E"}
    (tmp_path / "model.onnx.data").write_bytes(b"\0" * (64 + table.nbytes))  # not read again: the place decides
    assert shared.add_to(ort.SessionOptions(), head, tmp_path) == {"E"} and shared.reused == {"E": table.nbytes}


@pytest.mark.parametrize("damage", ["length", "offset past the end", "a folder", "outside", "another tensor's bytes"])
def test_a_damaged_record_in_the_head_is_an_error_or_a_run_never_a_crash(tiny_folder, tmp_path, monkeypatch, damage):
    """The head's embedding record pointing somewhere odd: the sharing code leaves what it cannot read to
    ORT, which either refuses the folder (a DriverError naming it) or loads it; nothing escapes as another
    exception, and where it runs MTP still prints greedy's tokens."""
    monkeypatch.setattr(CpuDevice, "shares_weights", True)
    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    head = onnx.load(folder / "mtp.onnx", load_external_data=False)
    table = next(t for t in head.graph.initializer if t.name == "model.embed_tokens.weight")
    entries = {e.key: e.value for e in table.external_data}
    size, offset = int(entries["length"]), int(entries.get("offset", 0))
    if damage == "length":
        _point(table, entries["location"], offset, size - 4)
    elif damage == "offset past the end":
        _point(table, entries["location"], (folder / entries["location"]).stat().st_size, size)
    elif damage == "a folder":
        (folder / "sub").mkdir()
        _point(table, "sub", 0, size)
    elif damage == "outside":  # the same bytes, in a file beside the folder
        shutil.copy(folder / entries["location"], tmp_path / "beside.data")
        _point(table, "../beside.data", offset, size)
    else:  # valid bytes of the right size, but not the main graph's embedding
        (folder / "other.data").write_bytes(np.random.default_rng(3).integers(0, 255, size, dtype=np.uint8).tobytes())
        _point(table, "other.data", 0, size)
    onnx.save(head, folder / "mtp.onnx")
    try:
        gen = Generator(folder, provider="cpu", mode="mtp", draft_tokens=2, max_length=64, threads=1)
    except DriverError as e:
        assert "mtp.onnx" in str(e) or str(folder) in str(e)
        return
    assert damage in ("outside", "another tensor's bytes"), "ORT loaded a record it should refuse"
    assert "model.embed_tokens.weight" not in gen.shared_weights.reused  # not read by us: ORT's own copy
    greedy = Generator(folder, provider="cpu", mode="greedy", max_length=64, threads=1)
    prompt = [5, 17, 300, 42]
    assert (gen.generate(prompt, 12, stop_at_eos=False).tokens
            == greedy.generate(prompt, 12, stop_at_eos=False).tokens)
