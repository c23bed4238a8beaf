"""`python -m models`: a bad preset, folder or knob is one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "models", *args], capture_output=True, text=True, cwd=cwd)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_build_writes_a_folder_and_reports_it(tmp_path):
    result = run("build", "--preset", "tiny", "--out", str(tmp_path / "m"), "--seed", "3", "--mtp-noise", "0.2")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["preset"] == "tiny" and report["seed"] == 3 and report["mtp_noise"] == 0.2
    assert report["bytes_on_disk"] == sum(p.stat().st_size for p in (tmp_path / "m").iterdir())


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--preset", "huge"], ["unknown preset 'huge'"]),
        (["--preset", "tiny", "--precision", "int8"], ["precision"]),
        (["--preset", "tiny", "--ep", "rocm"], ["ep must be"]),
        (["--preset", "tiny", "--state-window", "4"], ["state_window", "cuda"]),
        (["--preset", "tiny", "--state-window", "-1", "--ep", "cuda"], ["state_window"]),
        (["--preset", "tiny", "--mtp-noise", "-0.5"], ["mtp_noise"]),
        (["--preset", "tiny", "--mtp-noise", "lots"], ["--mtp-noise"]),
        (["--preset", "tiny", "--out-scale", "0"], ["out_scale"]),
        (["--preset", "tiny", "--seed", "-1"], ["seed"]),
        (["--preset", "tiny", "--threads", "0"], ["--threads"]),
    ],
)
def test_build_rejects_bad_options(tmp_path, args, fragments):
    assert_one_line_error(run("build", "--out", str(tmp_path / "m"), *args), *fragments)
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


def test_build_refuses_a_non_empty_folder_and_a_file(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    assert_one_line_error(run("build", "--preset", "tiny", "--out", str(tmp_path)), "not empty")
    assert_one_line_error(run("build", "--preset", "tiny", "--out", str(tmp_path), "--overwrite"), "keep.txt")
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert_one_line_error(run("build", "--preset", "tiny", "--out", str(tmp_path / "keep.txt")), "not a directory")


def test_overwrite_replaces_a_previous_build(tmp_path):
    assert run("build", "--preset", "tiny", "--out", str(tmp_path)).returncode == 0
    assert run("build", "--preset", "tiny", "--out", str(tmp_path), "--overwrite", "--seed", "1").returncode == 0


def test_missing_arguments_and_unknown_command():
    assert_one_line_error(run("build", "--preset", "tiny"), "--out")
    assert_one_line_error(run("frobnicate"), "invalid choice")
    assert_one_line_error(run(), "command")


def test_convert_rejects_bad_inputs(tmp_path):
    assert_one_line_error(run("convert", str(tmp_path / "nope"), str(tmp_path / "out")), "not a directory")
    assert_one_line_error(run("convert", str(tmp_path), str(tmp_path / "out")), "config.json")
    (tmp_path / "config.json").write_text("{}")
    assert_one_line_error(run("convert", str(tmp_path), str(tmp_path / "out"), "--precision", "int3"), "precision")
    assert_one_line_error(run("convert", str(tmp_path), str(tmp_path / "out"), "--ep", "cpu", "--state-window", "2"), "cuda")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    assert_one_line_error(run("convert", str(tmp_path), str(tmp_path / "out")), "not an empty folder")


def test_acceptance_rejects_a_folder_without_a_model(tmp_path):
    assert_one_line_error(run("acceptance", str(tmp_path)), "genai_config.json")


def test_acceptance_refuses_a_state_window_folder(tmp_path):
    assert run("build", "--preset", "tiny", "--out", str(tmp_path), "--ep", "cuda", "--state-window", "2").returncode == 0
    assert_one_line_error(run("acceptance", str(tmp_path)), "state window")


def test_head_folder_errors(tmp_path):
    assert_one_line_error(run("head-folder", str(tmp_path), str(tmp_path / "h")), "genai_config.json")


def test_sweep_rejects_bad_values():
    assert_one_line_error(run("sweep", "--preset", "tiny", "--mtp-noise", "a,b"), "--mtp-noise")
    assert_one_line_error(run("sweep", "--preset", "nope", "--mtp-noise", "0.1"), "unknown preset")
