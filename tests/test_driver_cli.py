"""`python -m driver generate`: output, JSON, progress, and one-line errors for user mistakes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import onnxruntime as ort
import pytest

import ops
import ops.progress
from driver.cli import main as cli_main
from driver.folder import read_folder

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "driver", *args], capture_output=True, text=True, cwd=REPO)


def main(argv):
    """The CLI in this process; generation runs single-threaded (faster on tiny models)."""
    if argv and argv[0] == "generate" and "--threads" not in argv:
        argv = [*argv, "--threads", "1"]
    return cli_main(argv)


def one_line_error(capsys, argv, *needles: str) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def folder_copy(tiny_folder, tmp_path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(tiny_folder, dst)
    return dst


def assert_stats_line(line: str) -> None:
    assert "tok/s" in line and "acceptance" in line and "tokens/round" in line and "verify=" in line, line


def test_generate_prints_the_prompt_then_its_continuation_and_stats_on_stderr(tiny_folder, capsys):
    argv = ["generate", "--model", str(tiny_folder), "--prompt", "def main():", "--max-new-tokens", "12",
            "--mode", "mtp", "--draft-tokens", "2"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    continuation = json.loads(capsys.readouterr().out)["text"]
    assert continuation and out == "def main():" + continuation + "\n"
    assert_stats_line(err.rstrip("\n").splitlines()[-1])


def test_without_model_the_shipped_trained_model_writes_python(capsys):
    """The README's first command: no --model, the trained default model (models/data/trained), read in
    place. Its continuation is printable Python: a newline, indentation, a keyword, no replacement
    character (a random-weight model prints none of these reliably)."""
    import keyword

    from models.defaults import TRAINED_FOLDER

    before = sorted((p.name, p.stat().st_mtime_ns) for p in TRAINED_FOLDER.iterdir())
    argv = ["generate", "--prompt", "def read_config(path):", "--max-new-tokens", "48"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("def read_config(path):")
    text = out[len("def read_config(path):"):]
    assert "\ufffd" not in text and all(c.isprintable() or c in "\n\t" for c in text)
    assert "\n    " in text  # an indented line
    assert any(word in keyword.kwlist for word in text.replace("(", " ").replace(":", " ").split())
    assert sorted((p.name, p.stat().st_mtime_ns) for p in TRAINED_FOLDER.iterdir()) == before  # never written


def test_generate_json(tiny_folder, capsys):
    rc = main(["generate", "--model", str(tiny_folder), "--prompt", "import os", "--max-new-tokens", "10",
               "--mode", "mtp", "--json", "--profile"])
    out, _ = capsys.readouterr()
    assert rc == 0
    result = json.loads(out)
    assert len(result["tokens"]) <= 10 and isinstance(result["text"], str)
    stats = result["stats"]
    assert stats["mode"] == "mtp" and stats["draft_tokens"] == 1 and stats["new_tokens"] == len(result["tokens"])
    assert {"tokens_per_second", "acceptance", "tokens_per_round", "forwards", "commits"} <= set(stats)
    assert "verify" in stats["phase_ms_per_round"]


def test_auto_mode_on_the_cpu_is_mtp_k1_for_a_small_model(tiny_folder, capsys):
    """--mode auto on the CPU: MTP for a folder with an MTP head, with k = 1 below CPU_K3_MIN_BYTES of
    main-model weights (the fastest measured there), unless --draft-tokens says otherwise."""
    from driver import cli

    base = ["generate", "--model", str(tiny_folder), "--prompt", "import os", "--max-new-tokens", "6", "--json"]
    assert main(base) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mode"] == "mtp" and result["mode_chosen_by"] == "auto" and result["stats"]["draft_tokens"] == 1
    assert main(base + ["--draft-tokens", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["draft_tokens"] == 4
    assert read_folder(tiny_folder).main.weight_bytes() < cli.CPU_K3_MIN_BYTES


def test_auto_mode_on_the_cpu_takes_k3_for_a_model_of_cpu_k3_min_bytes(tiny_folder, capsys, monkeypatch):
    """From CPU_K3_MIN_BYTES of main-model weights (where the forward streams its weights from memory
    and the verify's extra rows cost little), auto drafts 3 tokens a round on the CPU."""
    from driver import cli

    monkeypatch.setattr(cli, "CPU_K3_MIN_BYTES", read_folder(tiny_folder).main.weight_bytes())
    assert main(["generate", "--model", str(tiny_folder), "--prompt", "import os", "--max-new-tokens", "6",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["draft_tokens"] == 3


def test_greedy_json_matches_mtp_json(tiny_folder, capsys):
    outs = []
    for mode in ("greedy", "mtp"):
        assert main(["generate", "--model", str(tiny_folder), "--prompt", "class A:", "--max-new-tokens", "16",
                     "--mode", mode, "--json"]) == 0
        outs.append(json.loads(capsys.readouterr()[0]))
    assert outs[0]["tokens"] == outs[1]["tokens"]
    assert outs[0]["stats"]["forwards"].get("verify", 0) == 0 < outs[1]["stats"]["forwards"]["verify"]


def test_the_folder_is_never_written(folder_copy, capsys):
    def snapshot():
        return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder_copy.iterdir())

    before = snapshot()
    for mode in ("greedy", "mtp"):
        assert main(["generate", "--model", str(folder_copy), "--prompt", "x = 1", "--max-new-tokens", "6",
                     "--mode", mode]) == 0
    capsys.readouterr()
    assert snapshot() == before


def test_user_mistakes_are_one_line_errors(tiny_folder, tmp_path, folder_copy, capsys):
    model = str(tiny_folder)
    one_line_error(capsys, ["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"], "does not exist")
    (tmp_path / "file").write_text("x")
    one_line_error(capsys, ["generate", "--model", str(tmp_path / "file"), "--prompt", "x"], "is not a folder")
    one_line_error(capsys, ["generate", "--model", str(tmp_path), "--prompt", "x"], "genai_config.json is missing")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "x", "--draft-tokens", "0"], "from 1 to 8")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "x", "--draft-tokens", "9"], "from 1 to 8")
    # options of MTP rounds that greedy decoding would ignore
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "x", "--mode", "greedy", "--draft-tokens", "3"],
                   "--draft-tokens applies only to MTP decoding", "--mode greedy")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "x", "--mode", "greedy", "--commit", "replay"],
                   "--commit replay applies only to MTP decoding")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "x", "--max-new-tokens", "0"], "positive")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "x", "--max-new-tokens", "5000"],
                   "exceed the context length of 4096")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "word " * 5000], "more than the context length")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", ""], "prompt is empty")
    one_line_error(capsys, ["generate", "--model", model, "--prompt", "x", "--mode", "beam"], "invalid choice")
    one_line_error(capsys, ["generate", "--model", model], "--prompt")


def test_cuda_without_a_gpu_is_a_one_line_error(tiny_folder, capsys):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a CUDA GPU is visible here; this test is about machines without one")
    except Exception:
        pass
    one_line_error(capsys, ["generate", "--model", str(tiny_folder), "--prompt", "x", "--provider", "cuda"],
                   "--provider cuda")


def _fake_cupy(devices: int):
    """The part of CuPy the CUDA device's checks read: the number of GPUs CUDA sees."""
    runtime = types.SimpleNamespace(getDeviceCount=lambda: devices, CUDARuntimeError=RuntimeError)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("cuda_ep, cupy_gpus, listed_gpus, missing", [
    (True, None, [], {"CuPy", "GPU"}),           # this CI machine: neither CuPy nor a GPU
    (True, None, ["GPU 0: NVIDIA H200"], {"CuPy"}),
    (True, 0, [], {"GPU"}),                       # CuPy installed, no GPU
    (False, 1, ["GPU 0: NVIDIA H200"], {"onnxruntime-gpu"}),
])
def test_cuda_names_everything_it_is_missing(tiny_folder, capsys, monkeypatch, cuda_ep, cupy_gpus, listed_gpus,
                                             missing):
    """--provider cuda names, in one line, each of onnxruntime-gpu, CuPy and a visible GPU that is
    missing, and nothing that is there (without CuPy the GPUs are counted by ops.visible_gpus).
    Needs the change to driver/device.py's CudaDevice checks that reports them all at once."""
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda_ep else ["CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: providers)
    monkeypatch.setitem(sys.modules, "cupy", None if cupy_gpus is None else _fake_cupy(cupy_gpus))  # None: no CuPy
    monkeypatch.setattr(ops, "visible_gpus", lambda: listed_gpus)
    line = one_line_error(capsys, ["generate", "--model", str(tiny_folder), "--prompt", "x", "--provider", "cuda"],
                          "--provider cuda")
    for name in {"onnxruntime-gpu", "CuPy", "GPU"}:
        assert (name in line) == (name in missing), line


def test_broken_folders(folder_copy, capsys):
    argv = ["generate", "--model", str(folder_copy), "--prompt", "x", "--max-new-tokens", "4", "--mode", "mtp"]
    config_path = folder_copy / "genai_config.json"
    config = json.loads(config_path.read_text())

    config_path.write_text("{not json")
    one_line_error(capsys, argv, "not valid JSON")

    config_path.write_text(json.dumps({**config, "model": {**config["model"], "type": "llama"}}))
    one_line_error(capsys, argv, "model type 'llama' is not supported")

    config_path.write_text(json.dumps(config))
    (folder_copy / "tokenizer.json").rename(folder_copy / "tokenizer.moved")
    one_line_error(capsys, argv, "tokenizer.json is missing")
    (folder_copy / "tokenizer.moved").rename(folder_copy / "tokenizer.json")

    (folder_copy / "mtp.onnx").rename(folder_copy / "mtp.moved")
    one_line_error(capsys, argv, "mtp.onnx is missing")
    (folder_copy / "mtp.moved").rename(folder_copy / "mtp.onnx")

    (folder_copy / "model.onnx.data").rename(folder_copy / "data.moved")
    one_line_error(capsys, argv, "external data file", "model.onnx.data is missing")
    (folder_copy / "data.moved").rename(folder_copy / "model.onnx.data")

    (folder_copy / "model.onnx").write_bytes(b"not a model")
    one_line_error(capsys, argv, "model.onnx is not")


def test_folder_without_mtp_head_runs_greedy_and_refuses_mtp(folder_copy, capsys):
    config_path = folder_copy / "genai_config.json"
    config = json.loads(config_path.read_text())
    del config["model"]["mtp"]
    config_path.write_text(json.dumps(config))
    (folder_copy / "mtp.onnx").unlink()
    base = ["generate", "--model", str(folder_copy), "--prompt", "x = 1", "--max-new-tokens", "4"]
    assert main(base + ["--mode", "greedy"]) == 0
    assert main(base) == 0  # --mode auto: greedy for a folder without a head
    capsys.readouterr()
    one_line_error(capsys, base + ["--mode", "mtp"], "has no MTP head", "--mode greedy")
    one_line_error(capsys, base + ["--draft-tokens", "2"], "applies only to MTP decoding", "has no MTP head")


def test_real_process_error_has_no_traceback(tmp_path):
    done = run_cli("generate", "--model", str(tmp_path / "missing"), "--prompt", "x")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: model folder {tmp_path / 'missing'} does not exist"]


def test_identity_command_names_the_ops_whose_rows_differ(tiny_folder, capsys):
    assert main(["identity", "--model", str(tiny_folder), "--width", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr()[0])
    rows = report["rows"]
    assert rows["width"] == 3 and rows["argmax_equal"] == [True] * 3
    assert rows["kv_max_diff"] == 0.0 and rows["state_max_diff"] == 0.0
    assert report["origins"] == []
    one_line_error(capsys, ["identity", "--model", str(tiny_folder), "--width", "1"], "--width")


# -- progress ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("json_mode, stdout_is_terminal, bar", [
    (True, True, True),     # nothing streams until the end: the bar shows how far it got
    (False, False, True),   # the text goes to a file or a pipe
    (False, True, False),   # the text streams to the terminal: it is the progress, a bar would break it
])
def test_generation_progress_is_a_bar_on_a_terminal_stderr(tiny_folder, terminal, capsys, json_mode,
                                                           stdout_is_terminal, bar):
    err = terminal("stderr")
    out = terminal("stdout") if stdout_is_terminal else None
    argv = ["generate", "--model", str(tiny_folder), "--prompt", "x = 1", "--max-new-tokens", "6"]
    assert main(argv + (["--json"] if json_mode else [])) == 0
    assert ("generating" in err.getvalue() and "/6 [" in err.getvalue()) == bar, err.getvalue()  # n/6 tokens
    printed = out.getvalue() if out else capsys.readouterr().out
    if json_mode:
        assert len(json.loads(printed)["tokens"]) == 6  # stdout holds the JSON alone
    else:
        assert printed.startswith("x = 1") and "generating" not in printed


def test_generation_shows_no_bar_where_stderr_is_not_a_terminal(tiny_folder, capsys, monkeypatch):
    monkeypatch.setattr(ops.progress, "DELAY_S", 0)  # so that only the missing terminal can hide the bar
    assert main(["generate", "--model", str(tiny_folder), "--prompt", "x = 1", "--max-new-tokens", "6", "--json"]) == 0
    assert capsys.readouterr().err == ""


# -- sampling ---------------------------------------------------------------------------------------


def test_sampling_flags_are_reproducible_with_a_seed(tiny_folder, capsys):
    base = ["generate", "--model", str(tiny_folder), "--prompt", "def main():", "--max-new-tokens", "10",
            "--temperature", "0.7", "--top-k", "8", "--json"]
    runs = {}
    for mode, seed in (("mtp", "5"), ("mtp", "5"), ("mtp", "6"), ("greedy", "5")):
        assert main([*base, "--mode", mode, "--seed", seed]) == 0
        runs.setdefault((mode, seed), []).append(json.loads(capsys.readouterr().out))
    first, again = runs[("mtp", "5")]
    assert first["tokens"] == again["tokens"] and first["tokens"] != runs[("mtp", "6")][0]["tokens"]
    assert first["stats"]["sampling"] == {"temperature": 0.7, "top_k": 8, "top_p": 1.0, "seed": 5}
    assert runs[("greedy", "5")][0]["stats"]["sampling"]["seed"] == 5
    # text mode: the stats line on stderr names the knobs and the seed, also the one drawn for the run
    assert main(base[:-1] + ["--top-p", "0.9", "--mode", "mtp"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "sampling temperature=0.7 top_k=8 top_p=0.9 seed=" in line
    assert_stats_line(line)


def test_sampling_mistakes_are_one_line_errors(tiny_folder, capsys):
    base = ["generate", "--model", str(tiny_folder), "--prompt", "x"]
    one_line_error(capsys, [*base, "--temperature", "-1"], "temperature must be a finite number >= 0")
    one_line_error(capsys, [*base, "--temperature", "nan"], "temperature must be a finite number >= 0")
    one_line_error(capsys, [*base, "--temperature", "warm"], "--temperature", "invalid float value")
    one_line_error(capsys, [*base, "--temperature", "1", "--top-p", "0"], "top-p must be a number in (0, 1]")
    one_line_error(capsys, [*base, "--temperature", "1", "--top-p", "1.5"], "top-p must be a number in (0, 1]")
    one_line_error(capsys, [*base, "--temperature", "1", "--top-k", "-3"], "top-k must be an integer >= 0")
    one_line_error(capsys, [*base, "--temperature", "1", "--top-k", "2.5"], "--top-k", "invalid int value")
    one_line_error(capsys, [*base, "--temperature", "1", "--seed", "-1"], "seed must be an integer from 0")
    one_line_error(capsys, [*base, "--temperature", "1", "--seed", "1.5"], "--seed", "invalid int value")
    one_line_error(capsys, [*base, "--top-k", "8"], "top-k and top-p apply only when sampling")
    one_line_error(capsys, [*base, "--top-p", "0.5"], "top-k and top-p apply only when sampling")
    # checked before the model is read: a bad value is reported even with a missing folder
    one_line_error(capsys, ["generate", "--model", "/nonexistent", "--prompt", "x", "--temperature", "-1"],
                   "temperature")
