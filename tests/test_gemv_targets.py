"""bench/gemv.py's scoring of the GEMV's targets (gemv.targets; README.md lists how the latest run
scored), for the default path and the tiles path, on hand-made tables (a run on the GPU fills the
real ones)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gemv():
    sys.path.insert(0, str(REPO / "bench"))  # gemv.py imports its neighbour gpu_timing
    try:
        spec = importlib.util.spec_from_file_location("gemv_bench", REPO / "bench" / "gemv.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(REPO / "bench"))


def cell(us: float, pct: float = 50.0) -> dict:
    return {"us": us, "pct_of_copy_ceiling": pct}


def table(ours_us: dict, tiles_us: dict | None = None, pct: float = 80.0, tiles_pct: float = 90.0) -> dict:
    """chain and lm_head rows: ORT default 200 us, fpA_intB 150 us at every M; ours / tiles as given."""
    out = {"chain": {}, "lm_head": {}}
    for w in out:
        for M in (1, 2, 3, 4, 6, 8, 16):
            row = {"ort": cell(200.0), "ort_fpa_intb": cell(150.0), "ours": cell(ours_us[M], pct)}
            if tiles_us:
                row["ours_tiles"] = cell(tiles_us[M], tiles_pct)
            out[w][str(M)] = row
    return out


def verdicts(entries, impl):
    return {e["target"]: e["met"] for e in entries if e["impl"] == impl}


def test_each_path_is_scored_on_its_own_times(gemv):
    ours = {1: 140.0, 2: 145, 3: 146, 4: 148, 6: 150, 8: 170, 16: 180}  # M=8 1.21x M=1, 1.43x ORT
    tiles = {1: 120.0, 2: 125, 3: 126, 4: 127, 6: 130, 8: 130, 16: 140}  # M=8 1.08x, 1.67x ORT
    got = gemv.all_targets(table(ours, tiles))
    o, t = verdicts(got, "ours"), verdicts(got, "ours_tiles")
    assert o["chain M=8 <= 1.15 x M=1"] is False and t["chain M=8 <= 1.15 x M=1"] is True
    assert o["chain M=1 >= 1.6x faster than ORT default"] is False
    assert t["chain M=1 >= 1.6x faster than ORT default"] is True
    assert o["chain M=1..8 >= 85% of copy ceiling"] is False and t["chain M=1..8 >= 85% of copy ceiling"] is True
    assert o["lm_head M=1 at least as fast as ORT's best"] is True  # 140 <= min(200, 150)
    assert t["faster than both ORT paths at every M >= 2"] is True
    ratio = [e["measured"] for e in got if e["impl"] == "ours_tiles" and e["target"].startswith("chain M=8")]
    assert ratio == ["1.08x"]


def test_a_loss_to_an_ort_path_is_named(gemv):
    ours = {1: 100.0, 2: 100, 3: 100, 4: 100, 6: 100, 8: 100, 16: 160}  # M=16 slower than fpA_intB's 150
    got = {e["target"]: (e["met"], e["measured"]) for e in gemv.all_targets(table(ours))}
    met, measured = got["faster than both ORT paths at every M >= 2"]
    assert met is False
    assert "chain M=16 vs ort_fpa_intb" in measured and "lm_head M=16 vs ort_fpa_intb" in measured


def test_the_tiles_path_is_scored_only_when_it_ran(gemv):
    ours = {M: 100.0 for M in (1, 2, 3, 4, 6, 8, 16)}
    assert {e["impl"] for e in gemv.all_targets(table(ours))} == {"ours"}


def test_missing_numbers_are_no_data_not_met(gemv):
    got = gemv.targets({"chain": {"1": {"ours": cell(100.0)}}}, "ours_tiles")
    assert got and all(met is None and measured == "no data" for _, met, measured in got)
