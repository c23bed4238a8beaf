"""`python -m models`: a bad preset, folder or knob is one line on stderr and exit status 2.

The cases run the CLI in this process (models.__main__.main); one test runs it as a command."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ops.progress
from models.__main__ import main as models_main


def test_build_writes_a_folder_and_reports_it(tmp_path):
    """`python -m models` as a command: exit 0, the JSON report on stdout, nothing on stderr."""
    result = subprocess.run([sys.executable, "-m", "models", "build", "--preset", "tiny", "--out", str(tmp_path / "m"),
                             "--seed", "3", "--mtp-noise", "0.2"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert report["preset"] == "tiny" and report["seed"] == 3 and report["mtp_noise"] == 0.2
    assert report["bytes_on_disk"] == sum(p.stat().st_size for p in (tmp_path / "m").iterdir())


def assert_one_line_error(capsys, argv, *fragments):
    """The CLI on argv exits with status 2 after printing one `error:` line holding every fragment on
    stderr, no traceback, and nothing on stdout."""
    code = models_main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and out == ""
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--preset", "huge"], ["unknown preset 'huge'"]),
        (["--preset", "tiny", "--precision", "int8"], ["precision"]),
        (["--preset", "tiny", "--ep", "rocm"], ["ep must be"]),
        (["--preset", "tiny", "--state-window", "-1", "--ep", "cuda"], ["state_window"]),
        (["--preset", "tiny", "--state-window", "100000", "--ep", "cuda"], ["from 0 to 64", "GatedDeltaNet"]),
        (["--preset", "tiny", "--mtp-noise", "-0.5"], ["mtp_noise"]),
        (["--preset", "tiny", "--mtp-noise", "lots"], ["--mtp-noise"]),
        (["--preset", "tiny", "--out-scale", "0"], ["out_scale"]),
        (["--preset", "tiny", "--seed", "-1"], ["seed"]),
        (["--preset", "tiny", "--threads", "0"], ["--threads"]),
    ],
)
def test_build_rejects_bad_options(tmp_path, capsys, args, fragments):
    assert_one_line_error(capsys, ["build", "--out", str(tmp_path / "m"), *args], *fragments)
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


def test_build_refuses_a_non_empty_folder_and_a_file(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert_one_line_error(capsys, ["build", "--preset", "tiny", "--out", str(tmp_path)], "not empty")
    assert_one_line_error(capsys, ["build", "--preset", "tiny", "--out", str(tmp_path), "--overwrite"], "keep.txt")
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert_one_line_error(capsys, ["build", "--preset", "tiny", "--out", str(tmp_path / "keep.txt")],
                          "not a directory")


def snapshot(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def build_in_process(out, *args) -> int:
    return models_main(["build", "--preset", "tiny", "--out", str(out), "--threads", "1", *args])


def test_overwrite_replaces_a_previous_build(tmp_path, capsys):
    """--overwrite with another seed replaces the build: the weights differ, the tokenizer does not,
    and the folder is byte for byte what a fresh build of that seed writes."""
    out, fresh = tmp_path / "m", tmp_path / "fresh"
    assert build_in_process(out) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert build_in_process(out, "--overwrite", "--seed", "1") == 0
    report = json.loads(capsys.readouterr().out)
    after = snapshot(out)
    assert after.keys() == before.keys()
    assert after["model.onnx.data"] != before["model.onnx.data"] and after["mtp.onnx.data"] != before["mtp.onnx.data"]
    assert after["tokenizer.json"] == before["tokenizer.json"]  # the seed draws weights, not the tokenizer
    assert report["folder"] == str(out) and report["seed"] == 1
    assert os.listdir(tmp_path) == ["m"]  # no staging folder, no old build left aside
    assert build_in_process(fresh, "--seed", "1") == 0
    assert snapshot(fresh) == after


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_overwrite_leaves_the_previous_build(tmp_path, monkeypatch, error):
    """The build fails after model.onnx and its data are written (in the head): the old folder is
    byte for byte what it was, and no staging folder is left."""
    out = tmp_path / "m"
    assert build_in_process(out) == 0
    before = snapshot(out)

    def fail_midway(*args, **kwargs):
        raise error("simulated failure while writing the MTP head")

    # models.build is also the name of the build function (models/__init__.py): patch the module
    monkeypatch.setattr(importlib.import_module("models.build"), "build_mtp", fail_midway)
    with pytest.raises(error, match="simulated"):
        build_in_process(out, "--overwrite", "--seed", "1")
    assert snapshot(out) == before
    assert os.listdir(tmp_path) == ["m"]


def test_build_refuses_a_symlink_out(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere" / "missing")
    assert build_in_process(tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "is a symbolic link" in err
    assert not any((tmp_path / "elsewhere").iterdir())
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "out"]


def test_missing_arguments_and_unknown_command(capsys):
    assert_one_line_error(capsys, ["build", "--preset", "tiny"], "python -m models build", "--out", "usage:")
    assert_one_line_error(capsys, ["frobnicate"], "python -m models", "invalid choice", "usage:")
    assert_one_line_error(capsys, [], "python -m models", "command", "usage:")


def test_convert_rejects_bad_inputs(tmp_path, capsys):
    hf, out = str(tmp_path), str(tmp_path / "out")
    assert_one_line_error(capsys, ["convert", str(tmp_path / "nope"), out], "not a directory")
    assert_one_line_error(capsys, ["convert", hf, out], "config.json")
    (tmp_path / "config.json").write_text("{}")
    assert_one_line_error(capsys, ["convert", hf, out, "--precision", "int3"], "precision")
    assert_one_line_error(capsys, ["convert", hf, out, "--ep", "cpu", "--state-window", "2"], "cuda")
    assert_one_line_error(capsys, ["convert", hf, out, "--state-window", "65"], "from 0 to 64")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    assert_one_line_error(capsys, ["convert", hf, out], "not an empty folder")


@pytest.mark.parametrize("builder_exit", [0, 1])
def test_convert_moves_the_builders_folder_in_only_once_it_is_complete(tmp_path, monkeypatch, capsys, builder_exit):
    """The builder (faked: it writes a model, then fails or writes its config) writes into a staging
    folder: a failed run leaves no OUT, a good one leaves OUT with the fixes applied."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    out = tmp_path / "out"

    def fake_builder(command, **kwargs):
        written = Path(command[command.index("-o") + 1])
        assert written != out and written.is_dir()
        (written / "model.onnx").write_bytes(b"graph")
        if builder_exit == 0:
            config = {"model": {"decoder": {"filename": "model.onnx", "shared_initializers": []}}}
            (written / "genai_config.json").write_text(json.dumps(config))
        return subprocess.CompletedProcess(command, builder_exit, "", "builder: out of memory")

    monkeypatch.setattr(subprocess, "run", fake_builder)
    code = models_main(["convert", str(tmp_path / "hf"), str(out), "--ep", "cpu"])
    if builder_exit:
        assert code == 2 and "builder failed (exit 1): builder: out of memory" in capsys.readouterr().err
        assert sorted(os.listdir(tmp_path)) == ["hf"]
        return
    assert code == 0 and json.loads(capsys.readouterr().out)["removed_cpu_shared_initializers"] is True
    assert sorted(os.listdir(tmp_path)) == ["hf", "out"]
    assert sorted(os.listdir(out)) == ["genai_config.json", "model.onnx"]
    assert "shared_initializers" not in json.loads((out / "genai_config.json").read_text())["model"]["decoder"]


def test_acceptance_rejects_a_folder_without_a_model(tmp_path, capsys):
    assert_one_line_error(capsys, ["acceptance", str(tmp_path)], "genai_config.json")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--prompts", "0"], "prompts must be at least 1"),
        (["--prompt-length", "0"], "prompt length must be at least 1"),
        (["--new-tokens", "1"], "new tokens must be at least 2"),  # one token gives no trial
        (["--seed", "-1"], "seed must be at least 0"),
        (["--new-tokens", "4066"], "at most 4065 new tokens fit"),  # 32-token prompts, context 4096
    ],
)
def test_acceptance_rejects_options_it_cannot_measure_with(tiny_folder, capsys, args, fragment):
    assert_one_line_error(capsys, ["acceptance", str(tiny_folder), *args], fragment)


def test_acceptance_measures_up_to_the_last_position_the_context_holds(tiny_folder, capsys):
    """The bound above is not one token short: 4065 new tokens after 32 read position 4095."""
    assert models_main(["acceptance", str(tiny_folder), "--prompts", "1", "--new-tokens", "4065"]) == 0
    assert json.loads(capsys.readouterr().out)["trials"] == 4064


def test_sweep_rejects_measurement_options_before_building(capsys, monkeypatch):
    monkeypatch.setattr(importlib.import_module("models.build"), "build", lambda *a, **k: pytest.fail("built before checking the options"))
    assert_one_line_error(capsys, ["sweep", "--preset", "tiny", "--mtp-noise", "0.1", "--new-tokens", "0"],
                          "new tokens must be at least 2")


def test_acceptance_refuses_a_state_window_folder(tmp_path, capsys):
    assert models_main(["build", "--preset", "tiny", "--out", str(tmp_path), "--ep", "cuda",
                        "--state-window", "2"]) == 0
    capsys.readouterr()
    assert_one_line_error(capsys, ["acceptance", str(tmp_path)], "state window")


def test_head_folder_errors(tmp_path, capsys):
    assert_one_line_error(capsys, ["head-folder", str(tmp_path), str(tmp_path / "h")], "genai_config.json")


def test_sweep_rejects_bad_values(capsys):
    assert_one_line_error(capsys, ["sweep", "--preset", "tiny", "--mtp-noise", "a,b"], "--mtp-noise")
    assert_one_line_error(capsys, ["sweep", "--preset", "nope", "--mtp-noise", "0.1"], "unknown preset")


def test_head_folder_is_never_written_inside_the_model_folder(tmp_path):
    from models.head_folder import write_head_folder
    from ops.staging import OutputError

    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {}, "mtp": {"filename": "mtp.onnx"}}}))
    with pytest.raises(OutputError, match="inside the source folder"):
        write_head_folder(tmp_path, tmp_path / "head")
    assert [p.name for p in tmp_path.iterdir()] == ["genai_config.json"]


def test_build_shows_progress_on_a_terminal_stderr_only(tmp_path, capsys, monkeypatch, terminal):
    """A bar counts the bytes written on stderr when it is a terminal; stdout keeps the JSON report
    alone either way, and a stderr that is not a terminal (capsys here) gets nothing."""
    monkeypatch.setattr(ops.progress, "DELAY_S", 0)  # so that only the missing terminal can hide the bar
    assert build_in_process(tmp_path / "quiet") == 0
    assert capsys.readouterr().err == ""
    err = terminal("stderr")
    assert build_in_process(tmp_path / "shown") == 0
    assert "building tiny" in err.getvalue() and "B/s" in err.getvalue(), err.getvalue()
    assert json.loads(capsys.readouterr().out)["preset"] == "tiny"
