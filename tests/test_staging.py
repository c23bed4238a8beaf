"""ops.staging: outputs are written in a hidden staging folder and renamed into place, so a failed or
interrupted command leaves the previous output as it was and nothing half-written behind; and the
default-model cache (which builds through it) on an unwritable cache root."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from ops.staging import OutputError, check_output, staged_files, staged_folder


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below folder."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def snapshot_of(files: dict[str, str]) -> dict[str, str]:
    return {name: hashlib.sha256(text.encode()).hexdigest() for name, text in files.items()}


def old_build(tmp_path: Path) -> Path:
    final = tmp_path / "out"
    (final / "sub").mkdir(parents=True)
    (final / "a.txt").write_text("old a")
    (final / "sub" / "b.txt").write_text("old b")
    return final


def test_a_new_folder_appears_complete_and_nothing_else_remains(tmp_path):
    final = tmp_path / "parent" / "out"  # missing parents are made
    with staged_folder(final) as staging:
        assert staging.is_dir() and not any(staging.iterdir()) and not final.exists()
        assert staging.name != final.name and staging.parent.parent == final.parent  # a hidden sibling's child
        (staging / "a.txt").write_text("new a")
    assert snapshot(final) == snapshot_of({"a.txt": "new a"})
    assert os.listdir(final.parent) == ["out"]
    assert final.stat().st_mode & 0o777 != 0o700  # not mkdtemp's private mode


def test_overwrite_replaces_the_old_folder_only_at_the_end(tmp_path):
    final = old_build(tmp_path)
    before = snapshot(final)
    with staged_folder(final, overwrite=True) as staging:
        (staging / "a.txt").write_text("new a")
        assert snapshot(final) == before  # still the old folder while the new one is written
    assert snapshot(final) == snapshot_of({"a.txt": "new a"})
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failure_leaves_the_old_folder_and_no_staging(tmp_path, error):
    final = old_build(tmp_path)
    before = snapshot(final)
    with pytest.raises(error):
        with staged_folder(final, overwrite=True) as staging:
            (staging / "a.txt").write_text("half")
            raise error()
    assert snapshot(final) == before
    assert os.listdir(tmp_path) == ["out"]


def test_a_failed_rename_in_puts_the_old_contents_back(tmp_path, monkeypatch):
    final = old_build(tmp_path)
    before = snapshot(final)
    real_rename, calls = os.rename, []

    def rename(src, dst):
        calls.append((Path(src).parent.name, Path(dst).parent.name))
        if Path(src).parent.name == "new":  # the old entries went aside; the first new one fails
            raise OSError(errno.EIO, "simulated", str(dst))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="simulated"):
        with staged_folder(final, overwrite=True) as staging:
            (staging / "a.txt").write_text("new a")
    assert calls == [("out", "old"), ("out", "old"), ("new", "out"), ("old", "out"), ("old", "out")]
    assert snapshot(final) == before
    assert os.listdir(tmp_path) == ["out"]


def test_without_overwrite_a_folder_that_filled_meanwhile_is_kept(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    with pytest.raises(OutputError, match="is not empty"):
        with staged_folder(final) as staging:
            (staging / "a.txt").write_text("new a")
            (final / "theirs.txt").write_text("theirs")  # e.g. a concurrent command
    assert snapshot(final) == snapshot_of({"theirs.txt": "theirs"})
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("old", [False, True])
def test_an_existing_folder_keeps_its_inode(tmp_path, monkeypatch, old):
    """It may be the working directory of a shell (`--out .`) or a mount point: its entries are
    swapped, the folder itself stays."""
    final = old_build(tmp_path) if old else tmp_path / "out"
    final.mkdir(exist_ok=True)
    inode = final.stat().st_ino
    monkeypatch.chdir(final)
    with staged_folder(".", overwrite=old) as staging:
        (staging / "a.txt").write_text("new a")
    assert final.stat().st_ino == inode and Path("a.txt").read_text() == "new a"
    assert snapshot(final) == snapshot_of({"a.txt": "new a"})
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("target", ["missing/dir", "existing"])
def test_a_symlink_output_is_refused(tmp_path, target):
    (tmp_path / "existing").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / target)
    with pytest.raises(OutputError, match="is a symbolic link"):
        with staged_folder(link, overwrite=True):
            pytest.fail("the body must not run")
    assert not (tmp_path / "missing").exists() and not any((tmp_path / "existing").iterdir())
    assert sorted(os.listdir(tmp_path)) == ["existing", "link"]


def test_check_output_refuses_the_source_folder_and_paths_inside_it(tmp_path):
    source = tmp_path / "model"
    source.mkdir()
    with pytest.raises(OutputError, match="is the source folder"):
        check_output(source, source)
    with pytest.raises(OutputError, match="is inside the source folder"):
        check_output(source / "sub" / "out", source)
    (tmp_path / "via").symlink_to(source)
    with pytest.raises(OutputError, match="is inside the source folder"):  # through a linked parent too
        check_output(tmp_path / "via" / "out", source)
    check_output(tmp_path / "model_out", source)  # a sibling whose name starts alike is fine


def test_staged_files_are_moved_in_with_last_at_the_end(tmp_path, monkeypatch):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    real_rename, order = os.rename, []
    monkeypatch.setattr(os, "rename", lambda src, dst: (order.append(Path(dst).name), real_rename(src, dst)))
    with staged_files(folder, last="a.onnx") as staging:
        (staging / "a.onnx").write_text("model")
        (staging / "a.onnx.data").write_text("data")
        (staging / "sub").mkdir()
        (staging / "sub" / "w.data").write_text("nested")
        assert not (folder / "a.onnx").exists()
    assert order == ["a.onnx.data", "w.data", "a.onnx"]
    assert snapshot(folder) == snapshot_of({"a.onnx": "model", "a.onnx.data": "data", "keep.txt": "mine",
                                            "sub/w.data": "nested"})
    assert sorted(os.listdir(folder)) == ["a.onnx", "a.onnx.data", "keep.txt", "sub"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_staged_files_leave_nothing_on_failure(tmp_path, error):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(error):
        with staged_files(folder, last="a.onnx") as staging:
            (staging / "a.onnx.data").write_text("data")
            raise error()
    assert os.listdir(folder) == ["keep.txt"]


def test_staged_files_move_none_when_one_name_was_taken_meanwhile(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(OutputError, match="b.data already exists"):
        with staged_files(folder, last="c.onnx") as staging:
            for name in ("a.data", "b.data", "c.onnx"):
                (staging / name).write_text("new")
            (folder / "b.data").write_text("theirs")
    assert snapshot(folder) == snapshot_of({"b.data": "theirs"})  # a.data was moved in, then taken out again
