"""The tiles cache (ops.tiles_cache) behind the driver's default packing on CUDA, run here on the CPU
(whose MatMulNBits reads the tiles layout bit for bit): the same tokens and logits as the row-major
session, one pack per model version, entries checked and rebuilt, the folder never written, and every
cache failure a warning and a row-major session. ORT_MTP_CACHE_DIR points every test at its tmp_path."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from driver import Generator
from driver.errors import DriverError
from ops import packing, tiles_cache

PROMPT = [5, 17, 300, 42, 7, 99]
MAIN_PACKED = 8  # tiny: the K=256 matmuls (down_proj) take the layout, the K=128 ones do not


@pytest.fixture(scope="module")
def fp16_folder(tmp_path_factory) -> Path:
    """The tiny preset, int4 with fp16 activations (what the tiles layout takes), built once, only read."""
    from models.build import build
    from models.config import BuildOptions, preset

    out = tmp_path_factory.mktemp("tiles-src") / "model"
    build(preset("tiny"), out, BuildOptions(precision="int4", ep="cuda"), threads=1)
    return out


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(tiles_cache.CACHE_ENV, str(root))
    return root


@pytest.fixture()
def pack_calls(monkeypatch) -> list:
    """Counts the library packer's calls (one per packed node), still packing."""
    real, calls = packing.pack_tiles, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(packing, "pack_tiles", counted)
    return calls


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def _greedy(folder, pack, mode="greedy") -> tuple[Generator, list[int]]:
    gen = Generator(folder, provider="cpu", mode=mode, pack=pack, max_length=64)
    return gen, gen.generate(PROMPT, 10, mode="greedy", stop_at_eos=False).tokens


def _snapshot(folder: Path) -> dict:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(folder, dst)
    return dst


def test_packed_sessions_give_the_row_major_bits_and_leave_the_folder_alone(fp16_folder, cache):
    before = _snapshot(fp16_folder)
    plain, tokens = _greedy(fp16_folder, pack=False, mode="mtp")
    tiles, packed_tokens = _greedy(fp16_folder, pack=True, mode="mtp")
    assert plain.packed == 0 and tiles.packed > MAIN_PACKED  # the head's packable nodes too
    assert packed_tokens == tokens
    assert np.array_equal(tiles.main.logits, plain.main.logits)  # the last forward's rows, bitwise
    mtp = [g.generate(PROMPT, 10, stop_at_eos=False).tokens for g in (plain, tiles)]
    assert mtp[0] == mtp[1] == tokens  # MTP == greedy, packed or not
    assert len(_entries(cache)) == 2  # one per graph: model.onnx and mtp.onnx
    assert _snapshot(fp16_folder) == before  # same files, bytes and mtimes


def test_the_session_runs_the_cache_entrys_bytes(fp16_folder, cache, monkeypatch):
    """A cache entry holding row-major bytes under packing=1 changes the logits: the session reads the
    values the cache supplies, not the folder's."""
    _, tokens = _greedy(fp16_folder, pack=False)
    plain = Generator(fp16_folder, provider="cpu", mode="greedy", pack=False, max_length=64)
    plain.generate(PROMPT, 2, stop_at_eos=False)

    def copy_only(N, K, block_size, b=None, scales=None, out_b=None, out_scales=None, threads=0):
        out_b[:] = np.asarray(b).reshape(-1)
        out_scales[:] = np.asarray(scales).reshape(-1)
        return out_b, out_scales

    monkeypatch.setattr(packing, "pack_tiles", copy_only)
    wrong = Generator(fp16_folder, provider="cpu", mode="greedy", pack=True, max_length=64)
    wrong.generate(PROMPT, 2, stop_at_eos=False)
    assert wrong.packed == MAIN_PACKED and not np.array_equal(wrong.main.logits, plain.main.logits)


def test_a_second_session_reuses_the_entry(fp16_folder, cache, pack_calls):
    first, tokens = _greedy(fp16_folder, pack=True)
    assert len(pack_calls) == MAIN_PACKED
    (entry,) = _entries(cache)
    index = json.loads((entry / "index.json").read_text())
    assert index["format"] == tiles_cache.FORMAT_VERSION and len(index["tensors"]) == 2 * MAIN_PACKED
    assert all(t["offset"] % 64 == 0 for t in index["tensors"])
    assert index["inputs"]["model"]["path"] == str((fp16_folder / "model.onnx").resolve())
    second, again = _greedy(fp16_folder, pack=True)
    assert len(pack_calls) == MAIN_PACKED and second.packed == MAIN_PACKED  # no repack
    assert again == tokens and _entries(cache) == [entry]
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_cpu_default_is_row_major_and_pack_needs_the_matmul_rewrite(fp16_folder, cache):
    assert Generator(fp16_folder, provider="cpu", mode="greedy", max_length=64).packed == 0
    assert Generator(fp16_folder, provider="cpu", mode="greedy", max_length=64, rewrite=False, pack=True).packed == 0
    assert Generator(fp16_folder, provider="cpu", mode="greedy", max_length=64, rewrite=("attention",),
                     pack=True).packed == 0
    assert not cache.exists()
    with pytest.raises(DriverError, match="pack must be True, False or None, got 'yes'"):
        Generator(fp16_folder, provider="cpu", mode="greedy", max_length=64, pack="yes")


def _flip_first_bytes(entry: Path) -> None:
    index = json.loads((entry / "index.json").read_text())
    offset = index["tensors"][3]["offset"] + 10  # inside the checked first 64 KiB of a tensor
    with open(entry / "weights.bin", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _truncate(entry: Path) -> None:
    path = entry / "weights.bin"
    os.truncate(path, path.stat().st_size - 100)


@pytest.mark.parametrize("damage,why", [(_flip_first_bytes, "fails its crc32 check"),
                                        (_truncate, "weights.bin has"),
                                        (lambda e: (e / "index.json").write_text("{"), "does not parse")])
def test_a_damaged_entry_is_rebuilt_with_a_warning(fp16_folder, cache, pack_calls, caplog, damage, why):
    _, tokens = _greedy(fp16_folder, pack=True)
    (entry,) = _entries(cache)
    damage(entry)
    with caplog.at_level(logging.WARNING, logger="ops.tiles_cache"):
        gen, again = _greedy(fp16_folder, pack=True)
    assert why in caplog.text and str(entry) in caplog.text and "rebuilding" in caplog.text
    assert len(pack_calls) == 2 * MAIN_PACKED and gen.packed == MAIN_PACKED and again == tokens
    assert _entries(cache) == [entry] and not [p for p in cache.iterdir() if p.name.startswith(".")]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ops.tiles_cache"):
        _greedy(fp16_folder, pack=True)
    assert caplog.text == "" and len(pack_calls) == 2 * MAIN_PACKED  # the rebuilt entry passes


def test_a_changed_model_file_gets_a_new_entry_and_the_old_one_goes(fp16_folder, cache, tmp_path, pack_calls):
    folder = _copy(fp16_folder, tmp_path)
    _, tokens = _greedy(folder, pack=True)
    (old,) = _entries(cache)
    st = (folder / "model.onnx").stat()
    os.utime(folder / "model.onnx", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, again = _greedy(folder, pack=True)
    (new,) = _entries(cache)
    assert new.name != old.name and len(pack_calls) == 2 * MAIN_PACKED and again == tokens
    # a change to the weights file is a new key too; the other model's entries are left alone
    _greedy(fp16_folder, pack=True)
    st = (folder / "model.onnx.data").stat()
    os.utime(folder / "model.onnx.data", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _greedy(folder, pack=True)
    assert len(_entries(cache)) == 2 and new not in _entries(cache)


def _assert_row_major_with_warning(folder, caplog, tokens, where: str) -> None:
    with caplog.at_level(logging.WARNING, logger="ops.tiles_cache"):
        gen, got = _greedy(folder, pack=True)
    assert gen.packed == 0 and got == tokens
    assert where in caplog.text and "row-major layout" in caplog.text, caplog.text


def test_a_cache_below_a_regular_file_falls_back_to_row_major(fp16_folder, tmp_path, monkeypatch, caplog):
    _, tokens = _greedy(fp16_folder, pack=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(tiles_cache.CACHE_ENV, str(blocker / "cache"))
    _assert_row_major_with_warning(fp16_folder, caplog, tokens, str(blocker))


def test_an_unwritable_cache_falls_back_to_row_major(fp16_folder, cache, caplog):
    _, tokens = _greedy(fp16_folder, pack=False)
    cache.mkdir()
    cache.chmod(0o500)
    try:
        if os.access(cache, os.W_OK):
            pytest.skip("this user writes into a 0o500 folder (root): the permission cannot be tested")
        _assert_row_major_with_warning(fp16_folder, caplog, tokens, str(cache))
        assert "Permission denied" in caplog.text
    finally:
        cache.chmod(0o700)


def test_too_little_free_space_falls_back_to_row_major(fp16_folder, cache, monkeypatch, caplog):
    _, tokens = _greedy(fp16_folder, pack=False)
    monkeypatch.setattr(tiles_cache.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**9, used=10**9, free=1000))
    _assert_row_major_with_warning(fp16_folder, caplog, tokens, "not enough free disk space")
    assert _entries(cache) == []


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporaries_of_dead_processes_are_removed(fp16_folder, cache):
    cache.mkdir()
    dead = cache / f".tmp-{'a' * 64}-{_dead_pid()}"
    dead_old = cache / f".tmp-{'b' * 64}-{_dead_pid()}.old"
    alive = cache / f".tmp-{'c' * 64}-{os.getppid()}"  # a live process's write in progress
    other = cache / ".keep"  # not ours
    for d in (dead, dead_old, alive, other):
        d.mkdir()
        (d / "weights.bin").write_bytes(b"x")
    _greedy(fp16_folder, pack=True)
    assert not dead.exists() and not dead_old.exists() and alive.exists() and other.exists()


def test_a_lost_rename_race_uses_the_winners_entry(fp16_folder, cache, monkeypatch):
    """Another process renames its entry into place just before this one does: this one's is dropped
    and the winner's used (the same bytes: the same key)."""
    _, tokens = _greedy(fp16_folder, pack=False)
    real_rename = os.rename

    def the_other_process_wins(src, dst):
        if Path(src).name.startswith(".tmp-") and not Path(dst).exists():
            shutil.copytree(src, dst)
            (Path(dst) / "winner").write_text("")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", the_other_process_wins)
    gen, got = _greedy(fp16_folder, pack=True)
    assert gen.packed == MAIN_PACKED and got == tokens
    (entry,) = _entries(cache)
    assert (entry / "winner").exists() and not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_generate_cli_takes_no_pack(fp16_folder, cache, capsys):
    from driver.cli import build_parser, main

    args = build_parser().parse_args(["generate", "--prompt", "x", "--no-pack"])
    assert args.no_pack is True
    assert build_parser().parse_args(["generate", "--prompt", "x"]).no_pack is False
    assert main(["generate", "--model", str(fp16_folder), "--prompt", "def f():", "--max-new-tokens", "4",
                 "--no-pack", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["new_tokens"] == 4
    assert not cache.exists()


def test_pack_model_and_the_cache_share_one_eligibility(fp16_folder):
    """packing.packable is the one statement of which nodes take the layout: what pack_model skips
    and what the cache packs are the same split of the graph."""
    import onnx

    from driver.folder import read_folder
    from driver.sessions import rewrite_graph

    proto, _ = rewrite_graph(read_folder(fp16_folder).main, ("matmul",))
    loaded = onnx.ModelProto()
    loaded.CopyFrom(proto)
    onnx.external_data_helper.load_external_data_for_model(loaded, str(fp16_folder))
    packed, skipped = packing.pack_model(loaded)
    cached = tiles_cache._candidates(proto, fp16_folder / "model.onnx")
    assert packed == len(cached) == MAIN_PACKED
    index = packing.GraphIndex(proto)
    assert {packing.node_label(n) for n in packing.our_matmul_nodes(proto) if packing.packable(proto, n, index)} \
        == {label for label, _ in skipped}


def test_a_two_weight_node_gets_both_sets_packed(cache, tmp_path, cpu_session):
    """A gated MLP's swiglu node (ops.mlp's form, fused on CUDA too): the entry holds both of its sets
    packed, the node gets packing=1, and the session on the entry gives the row-major bits."""
    import onnx
    import onnxruntime as ort

    from ops import library_path, nbits

    rng = np.random.default_rng(8)
    gate, up = (nbits.random_weights(rng, 512, 32, dtype="float16") for _ in range(2))
    model = nbits.single_node_model(gate, domain="ort_mtp", second=up, activation="swiglu")
    a = rng.standard_normal((3, 512)).astype(np.float16)
    want = cpu_session(model).run(None, {"A": a})[0]
    path = tmp_path / "pair.onnx"
    onnx.save(model, path, save_as_external_data=True, location="pair.onnx.data", size_threshold=0)

    proto = onnx.load(path, load_external_data=False)
    weights = tiles_cache.prepare(proto, path)
    assert weights.nodes == 1 and sorted(weights.names) == ["B", "B2", "scales", "scales2"]
    assert packing.packable(proto, proto.graph.node[0]) == "already in the tiles layout"
    (entry,) = _entries(cache)
    assert json.loads((entry / "index.json").read_text())["inputs"]["nodes"][0]["b2"] == "B2"
    options = ort.SessionOptions()
    options.register_custom_ops_library(library_path())
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(tmp_path))
    weights.add_to(options)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert np.array_equal(session.run(None, {"A": a})[0], want)

