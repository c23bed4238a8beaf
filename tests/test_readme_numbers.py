"""README.md's measured numbers are bench/report.py's rendering of the committed result JSON
(bench/results/): the check fails when one drifts from the other, and the rendering follows the data."""

from __future__ import annotations

import copy
import re
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(report):
    return report.load()


def test_readme_matches_the_result_json(report, data):
    ok, diff = report.check(REPO / "README.md", data)
    assert ok, "README.md differs from bench/results (run python bench/report.py):\n" + diff


def test_every_generated_part_is_in_the_readme(report, data):
    text = (REPO / "README.md").read_text()
    for name in report.SECTIONS:
        assert f"<!-- report:{name}" in text and f"<!-- /report:{name} -->" in text, name


def test_a_changed_value_changes_the_rendering(report, data):
    readme = (REPO / "README.md").read_text()
    before = report.render(readme, data)
    changed = copy.deepcopy(data)
    ours = next(c for c in changed["e2e"]["json"]["configurations"] if c["label"] == "ours")
    ours["modes"]["greedy"]["tok_s_median"] = 321.0
    changed["gemv"]["json"]["table"]["chain"]["8"]["ours"]["us"] = 2 * 129.2
    after = report.render(readme, changed)
    assert after != before
    assert "| 321.0 |" in after and "| 321.0 |" not in before
    # the opening's M=8 / M=1 claim follows gemv.json too
    m8 = after.split("<!-- report:m8 -->")[1].split("<!-- /report:m8 -->")[0]
    ratio = 2 * 129.2 / data["gemv"]["json"]["table"]["chain"]["1"]["ours"]["us"]
    assert m8.startswith(f"{ratio:.2f}x at M = 8")


def test_the_side_by_side_follows_the_runs_memory_and_genai_acceptance(report, data):
    """A run that measured each Generator's memory gets a sentence with it; a run whose onnxruntime-genai
    acceptances are counted as ours (accepted / drafted) loses the footnote on genai's own measure."""
    readme = (REPO / "README.md").read_text()
    changed = copy.deepcopy(data)
    e2e = changed["e2e"]["json"]
    ours = next(c for c in e2e["configurations"] if c["label"] == "ours")
    ours["memory_bytes"] = {"mtp_generator": 24.3e9, "greedy_generator": 19.6e9, "peak_both": 43.9e9}
    e2e["genai"]["acceptance"] = "accepted / drafted"
    after = report.render(readme, changed)
    assert "MTP 24.3 GB, greedy 19.6 GB" in after
    e2e["info"] = {"gpu": "NVIDIA H100 80GB HBM3", "onnxruntime": "1.31.1"}  # the run's own machine, not the GEMV run's
    assert "One NVIDIA H100 80GB HBM3, ONNX Runtime 1.31.1." in report.render(readme, changed)
    assert "acceptance_rate`: accepted / drafts compared" not in after
    before = report.render(readme, data)
    assert "acceptance_rate`: accepted / drafts compared" in before
    assert after.count("GB, greedy") == before.count("GB, greedy") + 1  # the trained-like run's table has its own


def greedy_cell(data) -> tuple[str, str]:
    """Our greedy tok/s as README's table prints it, and the same cell nudged by 0.1."""
    ours = next(c for c in data["e2e"]["json"]["configurations"] if c["label"] == "ours")
    value = round(ours["modes"]["greedy"]["tok_s_median"], 1)
    return f"tiles layout) | {value:.1f} |", f"tiles layout) | {value + 0.1:.1f} |"


def test_check_fails_on_a_drifted_readme(report, data, tmp_path):
    readme = (REPO / "README.md").read_text()
    cell, nudged = greedy_cell(data)
    drifted = readme.replace(cell, nudged, 1)
    assert drifted != readme
    path = tmp_path / "README.md"
    path.write_text(drifted)
    ok, diff = report.check(path, data)
    assert not ok and nudged in diff and cell in diff


def test_a_missing_marker_is_an_error(report, data):
    with pytest.raises(report.ReportError, match="m8"):
        report.render("no markers here <!-- report:measured --><!-- /report:measured -->", data)


def test_check_exit_status(report, data, tmp_path, monkeypatch, capsys):
    assert report.main(["--check"]) == 0
    cell, nudged = greedy_cell(data)
    path = tmp_path / "README.md"
    path.write_text((REPO / "README.md").read_text().replace(cell, nudged, 1))
    monkeypatch.setattr(report, "README", path)
    assert report.main(["--check"]) == 1
    assert f"+| `python -m driver generate` (the defaults: our ops, {cell}" in capsys.readouterr().out


def test_every_markdown_link_resolves():
    """Every relative link in README.md and docs/*.md names a file that exists (and, into a markdown
    file, a heading that exists there)."""
    link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")

    def strip_code(text: str) -> str:
        return re.sub(r"```.*?```", "", text, flags=re.S)

    def anchors(path: Path) -> set[str]:
        headings = re.findall(r"^#+\s+(.*)$", strip_code(path.read_text()), re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}

    broken, seen = [], 0
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in link.findall(strip_code(doc.read_text())):
            if re.match(r"[a-z]+://", target):
                continue
            seen += 1
            path, _, fragment = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert seen > 20 and not broken, broken


def test_the_results_index_lists_every_run_folder():
    """bench/results/README.md's table names every folder under bench/results (each with its README) and
    nothing else: a run committed without its row, or a row left after its folder went, fails here."""
    results = REPO / "bench" / "results"
    index = (results / "README.md").read_text()
    listed = set(re.findall(r"^\|[^|\n]*\|[^|\n]*\| \[[^\]]*\]\(([^)/]+)/README\.md\)", index, re.M))
    folders = {p.name for p in results.iterdir() if p.is_dir()}
    assert listed == folders, {"not in the table": sorted(folders - listed), "no such folder": sorted(listed - folders)}
    assert all((results / name / "README.md").is_file() for name in folders)


def test_the_trained_like_table_follows_its_run(report, data):
    """The side by side at a trained-like acceptance states the knobs it was built with, its machine and
    the targets scored on it, all from its JSON."""
    readme = (REPO / "README.md").read_text()
    changed = copy.deepcopy(data)
    e2e = changed["trained"]["json"]
    e2e["build"]["out_scale"] = 0.005
    e2e["info"]["gpu"] = "NVIDIA H100 80GB HBM3"
    ours = next(c for c in e2e["configurations"] if c["label"] == "ours")
    ours["modes"]["mtp_k4"]["tok_s_median"] = 299.0  # below 300: k=3's 408.0 is then the best
    after = report.render(readme, changed)
    assert "--out-scale 0.005" in after and "--out-scale 0.01`" not in after
    assert "at a trained head's acceptance, one NVIDIA H100 80GB HBM3" in after
    assert "our best MTP (k=3)" in after
