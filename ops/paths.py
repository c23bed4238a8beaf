"""Where a path read from a model folder's own files may point."""

from __future__ import annotations

from pathlib import Path


def inside_folder(location) -> bool:
    """A relative path that stays inside the folder it is relative to: not empty, not absolute, no "..".
    The rule for every name a model folder gives of its own files (external data locations, the graph
    file names of genai_config.json), so that reading a folder never reads or writes outside it."""
    if not isinstance(location, str) or not location:
        return False
    path = Path(location)
    return not path.is_absolute() and ".." not in path.parts
