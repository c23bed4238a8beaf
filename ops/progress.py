"""Progress of a long step (building a model, packing weights, generating on the CPU) as a tqdm bar on
stderr, shown only where stderr is a terminal: pipes, log files and tests see no change, and stdout
(reports, JSON, generated text) is never written to.

    with progress_bar("packing model.onnx", total=len(nodes), unit="node") as bar:
        for node in nodes:
            ...
            bar.update()
"""

from __future__ import annotations

import sys

DELAY_S = 1.0  # a step that ends sooner shows no bar at all


class _NoBar:
    """What progress_bar returns where nothing is shown: the part of tqdm's interface we use."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(desc: str, total: int | None = None, unit: str = "it", unit_scale: bool = False,
                 enabled: bool = True):
    """A tqdm bar on stderr that disappears when closed, if `enabled` and stderr is a terminal;
    otherwise a stand-in that does nothing (and tqdm is not even imported). total=None counts
    without a percentage; unit_scale=True prints large counts as 1.2G and so on."""
    if not (enabled and sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(desc=desc, total=total, unit=unit, unit_scale=unit_scale, file=sys.stderr, leave=False,
                delay=DELAY_S, dynamic_ncols=True)
