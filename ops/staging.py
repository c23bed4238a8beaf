"""Write outputs somewhere hidden first, then rename them into place: an interrupted or failed
command leaves the previous output as it was and nothing half-written behind.

    with staged_folder(out, overwrite=True) as staging:   # a whole folder (models build, ops rewrite)
        write_everything_into(staging)
    # here `out` is the new folder; on an exception (KeyboardInterrupt too) `out` is untouched

    with staged_files(folder, last="new.onnx") as staging:  # new files for an existing folder
        write_new_files_into(staging)                       # under the names they get in `folder`

The staging area is a hidden folder next to the output (`.NAME.staging-XXXXXXXX`): on the same file
system, so moving the result in is a rename, never a copy. A new folder appears in one rename; an
existing one keeps its inode and has its entries swapped (each rename undone if one fails). The
staging area is removed on the way out, whatever happened. Every command of the package that
writes folders goes through here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputError(ValueError):
    """An output path that must not be written (a user mistake: CLIs print it as one line)."""


def check_output(output: Path, source: Path | None = None) -> None:
    """Refuses an output that is a symbolic link (writing through one can land anywhere, the source
    model's folder included, even when it dangles) and, given the source folder, an output that is
    that folder or lies inside it (the user's model folder is only ever read)."""
    output = Path(output)
    if output.is_symlink():
        raise OutputError(f"output {output} is a symbolic link (to {os.readlink(output)}); "
                          "give the real path of a new or empty folder or file")
    if source is None:
        return
    out, src = output.resolve(), Path(source).resolve()
    if out == src:
        raise OutputError(f"output {output} is the source folder {source}; write the output elsewhere")
    if src in out.parents:
        raise OutputError(f"output {output} is inside the source folder {source}; write the output elsewhere")


@contextmanager
def staged_folder(final: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yields a new empty folder to write `final`'s contents into; on normal exit it becomes
    `final`. With overwrite an existing `final`'s contents are replaced, only once the new ones are
    complete (old renamed aside, new renamed in, old deleted); without it `final` must be absent or
    empty. On an exception (KeyboardInterrupt included) the staging folder is removed and `final` is
    left as it was."""
    final = Path(final)
    check_output(final)
    final = final.resolve()  # "." or "x/..": the real name and parent (final itself is no link)
    with _work_folder(final.parent, final.name) as work:
        staging = work / "new"
        staging.mkdir()  # not the work folder itself: mkdtemp makes that one private (0700)
        yield staging
        _swap_in(staging, final, aside=work / "old", overwrite=overwrite)


@contextmanager
def staged_files(folder: str | os.PathLike, last: str | None = None) -> Iterator[Path]:
    """Yields an empty staging folder for new files of the existing `folder`, written under their
    paths relative to it; on normal exit they are moved into `folder` (`last`, a relative path, after
    the others: a model file should appear only once the data it reads is there). None of them may
    exist in `folder` yet. On an exception nothing is left in `folder`."""
    folder = Path(folder).resolve()
    with _work_folder(folder, Path(last).name if last else "files") as staging:
        yield staging
        files = sorted(p.relative_to(staging) for p in staging.rglob("*") if not p.is_dir())
        files.sort(key=lambda rel: rel.as_posix() == last)  # stable: only moves `last` to the end
        for rel in files:
            if os.path.lexists(folder / rel):
                raise OutputError(f"{folder / rel} already exists (it was not there when the command started)")
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        _rename_all([(staging / rel, folder / rel) for rel in files])


@contextmanager
def _work_folder(parent: Path, name: str) -> Iterator[Path]:
    """A hidden temporary folder `.NAME.staging-XXXXXXXX` in `parent`, removed on the way out."""
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=parent))
    try:
        yield work
    finally:
        # After a swap this deletes the old contents: the new ones are in place, so a file that
        # cannot be deleted (or an interrupt here) must not turn the command into a failure.
        shutil.rmtree(work, ignore_errors=True)


def _swap_in(new: Path, final: Path, aside: Path, overwrite: bool) -> None:
    if not final.exists():
        os.rename(new, final)  # one rename: the folder appears complete
        return
    # An existing folder stays (it may be a shell's working directory or a mount point, and keeps
    # its owner and mode): its entries are swapped instead.
    old = sorted(final.iterdir())
    if old and not overwrite:
        raise OutputError(f"output folder {final} is not empty")
    aside.mkdir()
    _rename_all([(entry, aside / entry.name) for entry in old] +
                [(entry, final / entry.name) for entry in sorted(new.iterdir())])


def _rename_all(moves: list[tuple[Path, Path]]) -> None:
    """Renames each (source, target) in order; if one fails (or is interrupted), those already done
    are renamed back, so either all moved or none did."""
    done: list[tuple[Path, Path]] = []
    try:
        for source, target in moves:
            os.rename(source, target)
            done.append((source, target))
    except BaseException:
        for source, target in reversed(done):
            os.rename(target, source)
        raise
