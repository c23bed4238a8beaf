"""The CLI's promise under a careless user and a hostile model folder: one line `error: ...` on
stderr, exit status 2, no traceback (and Ctrl-C: status 130, quietly). One test per defect found in a
reliability review; the folder cases edit one shared copy of the tiny preset, put back after each test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from driver import DriverError, Generator
from driver.generator import available_cores
from test_driver_cli import REPO, main, one_line_error

CONFIG = "genai_config.json"


@pytest.fixture(scope="module")
def shared_copy(tiny_folder, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("reliability") / "model"
    shutil.copytree(tiny_folder, dst)
    return dst


@pytest.fixture()
def folder(shared_copy, tiny_folder):
    """The module's copy of the tiny folder; whatever a test breaks in it is mended afterwards."""
    yield shared_copy
    shared_copy.chmod(0o755)
    for src in tiny_folder.iterdir():
        dst = shared_copy / src.name
        if dst.exists():
            dst.chmod(0o644)
        if src.name == CONFIG or not dst.exists() or dst.stat().st_size != src.stat().st_size \
                or (src.suffix == ".onnx" and dst.read_bytes() != src.read_bytes()):  # a graph edited in place
            shutil.copy2(src, dst)


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / CONFIG).read_text())
    change(config["model"])
    (folder / CONFIG).write_text(json.dumps(config))


def generate(folder: Path, *extra: str) -> list[str]:
    return ["generate", "--model", str(folder), "--prompt", "x = 1", "--max-new-tokens", "2", "--mode", "mtp", *extra]


@pytest.fixture(scope="module")
def greedy(tiny_folder):
    return Generator(tiny_folder, provider="cpu", mode="greedy", max_length=32, threads=1)


# -- options ----------------------------------------------------------------------------------------


def test_threads_are_bounded_by_the_cores_present(tiny_folder, capsys):
    cores = available_cores()
    for threads in ("0", "-1", str(cores + 1), "100000"):
        one_line_error(capsys, generate(tiny_folder, "--threads", threads), f"from 1 to {cores}", f"got {threads}")
    for threads in (0, cores + 1, 1.5):
        with pytest.raises(DriverError, match=f"threads must be an integer from 1 to {cores}"):
            Generator(tiny_folder, mode="greedy", max_length=32, threads=threads)
    assert Generator(tiny_folder, mode="greedy", max_length=32, threads=cores).device.threads == cores


def test_prefill_chunk_is_capped_by_the_context(tiny_folder, capsys):
    one_line_error(capsys, generate(tiny_folder, "--prefill-chunk", "100000000"), "prefill chunk",
                   "context length 4096", "got 100000000")
    one_line_error(capsys, generate(tiny_folder, "--prefill-chunk", "0"), "prefill chunk", "got 0")
    with pytest.raises(DriverError, match="prefill chunk"):
        Generator(tiny_folder, mode="greedy", max_length=32, prefill_chunk=4097, threads=1)
    # within the context but past max_length: buffers sized for max_length, the rows a prompt can fill
    gen = Generator(tiny_folder, mode="greedy", max_length=32, prefill_chunk=4096, threads=1)
    assert gen.prefill_chunk == 32 and gen.main.logits.shape[1] == 32


def test_a_prompt_that_is_not_utf8_is_a_one_line_error(tiny_folder, capsys, greedy):
    prompt = os.fsdecode(b"hi\xff\xfe")  # what Python makes of such bytes in argv: lone surrogates
    one_line_error(capsys, ["generate", "--model", str(tiny_folder), "--prompt", prompt], "not valid UTF-8",
                   "byte 0xff")
    with pytest.raises(DriverError, match="not valid UTF-8"):
        greedy.generate("\ud800 lone", 2)


def test_token_ids_are_checked_against_the_vocabulary(greedy):
    vocab = greedy.folder.vocab_size
    for bad in ([-1], [5, vocab], [vocab + 10**6]):
        with pytest.raises(DriverError, match=f"outside the vocabulary \\(0 to {vocab - 1}\\)"):
            greedy.generate(bad, 2)
    for bad in ([1.5], ["7"], [True]):
        with pytest.raises(DriverError, match="token ids must be integers"):
            greedy.generate(bad, 2)
    ids = greedy.encode("def main():")
    assert greedy.generate(np.array(ids), 3).tokens == greedy.generate(ids, 3).tokens


@pytest.mark.parametrize("prompt,kw,needle", [
    (None, {}, "the prompt must be text or a sequence of token ids, got NoneType"),
    (5, {}, "the prompt must be text or a sequence of token ids, got int"),
    ([1, 2], {"max_new_tokens": True}, "max new tokens must be a positive integer, got True"),
    ([1, 2], {"mode": "fast"}, "mode must be greedy or mtp, got 'fast'"),  # was run as greedy
    ([1, 2], {"draft_tokens": np.bool_(True)}, "draft tokens must be an integer from 1 to 8"),
])
def test_generate_arguments_are_checked(greedy, prompt, kw, needle):
    """Generator.generate's arguments as an API caller may pass them (a fuzz of the arguments found the
    first three a TypeError or a silent greedy run)."""
    with pytest.raises(DriverError, match=re.escape(needle)):
        greedy.generate(prompt, **({"max_new_tokens": 2} | kw))


def test_numpy_integers_count_as_integers(tiny_folder, greedy):
    """Counts and sizes of numpy's integer types, as a caller computing them with numpy has them: the
    Generator's sizes and generate's counts take them as the ints they are (they were refused, or
    reached ops.state_window as a ValueError)."""
    gen = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=np.int64(2), max_length=np.int64(32),
                    prefill_chunk=np.int32(8), threads=np.int32(1))
    assert (gen.draft_tokens, gen.max_length, gen.prefill_chunk) == (2, 32, 8)
    ids = greedy.encode("def main():")
    result = gen.generate(ids, np.int64(4), draft_tokens=np.int16(1), stop_at_eos=False)
    assert len(result.tokens) == 4 and result.stats.draft_tokens == 1
    assert result.tokens == greedy.generate(ids, 4, stop_at_eos=False).tokens
    with pytest.raises(DriverError, match="max length must be an integer from 2"):
        Generator(tiny_folder, provider="cpu", mode="greedy", max_length="64")


# -- genai_config.json ------------------------------------------------------------------------------


def _set(section: str, key: str, value):
    def change(model):
        target = model
        for part in filter(None, section.split(".")):
            target = target[part]
        target[key] = value
    return change


@pytest.mark.parametrize("section,key,value,expected", [
    ("", "eos_token_id", "abc", "a token id or a list of token ids"),
    ("", "eos_token_id", None, "a token id or a list of token ids"),
    ("", "eos_token_id", {}, "a token id or a list of token ids"),
    ("", "eos_token_id", [[1]], "a token id or a list of token ids"),
    ("decoder.inputs", "past_key_names", 3, "a name template with %d"),
    ("decoder.inputs", "past_conv_names", 3, "a name template with %d"),
    ("decoder.outputs", "present_key_names", 3, "a name template with %d"),
    ("decoder.outputs", "logits", ["logits"], "a non-empty string"),
    ("mtp", "enabled", "no", "true or false"),
    ("decoder", "head_size", 10**30, "a positive integer below 2**31"),
    ("", "context_length", 2**31, "a positive integer below 2**31"),
    ("", "eos_token_id", [2**63], "a token id or a list of token ids"),
])
def test_config_values_of_the_wrong_type(folder, capsys, section, key, value, expected):
    edit_config(folder, _set(section, key, value))
    dotted = ".".join(filter(None, ("model", section, key)))
    one_line_error(capsys, generate(folder), str(folder / CONFIG), f"'{dotted}' must be {expected}",
                   f"got {json.dumps(value)}")


def test_config_names_every_input_the_graph_needs(folder, capsys):
    edit_config(folder, lambda model: model["decoder"]["inputs"].pop("past_conv_names"))
    one_line_error(capsys, generate(folder), str(folder / "model.onnx"), "'past.0.conv'", "'model.decoder.inputs'")


def test_config_hidden_size_must_be_the_graphs(folder, capsys):
    edit_config(folder, _set("decoder", "hidden_size", 64))
    one_line_error(capsys, generate(folder), "'hidden_states' has 128 columns", "'model.decoder.hidden_size' is 64")


# -- files ------------------------------------------------------------------------------------------


def _deny_reading(monkeypatch, denied: Path) -> None:
    """os.access as a user who may not read or enter `denied` (root may read anything)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != denied and real(path, mode, **kw))


@pytest.mark.parametrize("name,needle", [
    ("", "model folder {} cannot be opened"),
    (CONFIG, "{} cannot be read"),
    ("tokenizer.json", "{} cannot be read"),
    ("model.onnx", "{} cannot be read"),
    ("model.onnx.data", "external data file {} cannot be read"),
])
def test_unreadable_files_are_named(folder, capsys, monkeypatch, name, needle):
    path = folder / name if name else folder
    _deny_reading(monkeypatch, path)
    one_line_error(capsys, generate(folder, "--mode", "greedy"), needle.format(path), "permission denied")


def test_an_unreadable_head_blocks_only_mtp(folder, capsys, monkeypatch):
    _deny_reading(monkeypatch, folder / "mtp.onnx.data")
    assert main(generate(folder, "--mode", "greedy")) == 0
    capsys.readouterr()
    one_line_error(capsys, generate(folder), f"{folder / 'mtp.onnx.data'} cannot be read", "--mode greedy")


def test_unreadable_data_as_a_user_without_read_permission(folder):
    """The same check against the kernel's own permission check, not a patched os.access: root
    reads anything, so as root the CLI runs without the capabilities that let it."""
    (folder / "model.onnx.data").chmod(0)
    command = [sys.executable, "-m", "driver", *generate(folder, "--threads", "1")]
    if os.geteuid() == 0:
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
        if not shutil.which("setpriv") or subprocess.run([*drop, "true"], capture_output=True).returncode:
            pytest.skip("root here, and setpriv cannot drop the capabilities that let root read any file")
        command = drop + command
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"error: {folder / 'model.onnx'}: external data file "
                                        f"{folder / 'model.onnx.data'} cannot be read (permission denied)"]


def test_a_missing_head_blocks_only_mtp(folder, capsys):
    (folder / "mtp.onnx").unlink()
    assert main(generate(folder, "--mode", "greedy")) == 0
    capsys.readouterr()
    one_line_error(capsys, generate(folder), "MTP head is unavailable", f"{folder / 'mtp.onnx'} is missing",
                   "--mode greedy")


def _edit_graph(path: Path, change) -> None:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    change(proto)
    onnx.save(proto, str(path))


def test_a_name_that_is_not_text_is_a_damaged_model(folder, capsys):
    """A byte of a node name turned into one that is not UTF-8 (a damaged file, found by a byte fuzz of
    model.onnx): protobuf then hands over bytes where a name is read as text."""
    path = folder / "model.onnx"
    data = bytearray(path.read_bytes())
    data[data.index(b"/model/layers.0/")] = 0xFF
    path.write_bytes(bytes(data))
    one_line_error(capsys, generate(folder), f"{path} is not a valid ONNX model", "is not UTF-8 text")


def test_an_attribute_of_no_type_is_a_damaged_model(folder, capsys):
    """An attribute whose type field reads UNDEFINED: onnx-ir reads the graph but cannot write it back
    after the rewrite (found by the byte fuzz)."""
    def untype(proto):
        node = next(n for n in proto.graph.node if n.op_type == "MRotaryEmbedding" and n.attribute)
        node.attribute[0].type = 0  # AttributeProto.UNDEFINED
    _edit_graph(folder / "model.onnx", untype)
    one_line_error(capsys, generate(folder), f"{folder / 'model.onnx'}: the model is not a valid ONNX graph",
                   "UNDEFINED")


def test_an_external_data_length_that_is_not_a_number(folder, capsys):
    def corrupt(proto):
        init = next(i for i in proto.graph.initializer if i.external_data)
        next(e for e in init.external_data if e.key == "length").value = "B6384"
    _edit_graph(folder / "model.onnx", corrupt)
    one_line_error(capsys, generate(folder), f"{folder / 'model.onnx'} is not a valid ONNX model",
                   "external data length is 'B6384', not a number of bytes")


def test_a_library_that_is_not_one_is_named(tiny_folder, capsys, monkeypatch, tmp_path):
    fake = tmp_path / "libfake.so"
    fake.write_text("not a shared library")
    monkeypatch.setenv("ORT_MTP_LIBRARY", str(fake))
    one_line_error(capsys, generate(tiny_folder), f"{fake} is not a usable ONNX Runtime custom-op library")


@pytest.mark.parametrize("value", ["verbose", "5", "-1"])
def test_a_bad_ort_log_level_is_named(tiny_folder, capsys, monkeypatch, value):
    monkeypatch.setenv("DRIVER_ORT_LOG_LEVEL", value)
    one_line_error(capsys, generate(tiny_folder), "DRIVER_ORT_LOG_LEVEL must be one of 0 (verbose)", repr(value))


def test_ort_prints_nothing_above_our_error(folder, capfd, monkeypatch):
    """Session creation fails (data file cut short): ORT's logger would print its own error line."""
    monkeypatch.delenv("DRIVER_ORT_LOG_LEVEL", raising=False)
    with open(folder / "model.onnx.data", "r+b") as data:
        data.truncate(1000)
    assert main(generate(folder, "--mode", "greedy")) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {folder / 'model.onnx'}: ONNX Runtime could not"), lines


# -- Ctrl-C -----------------------------------------------------------------------------------------

_INTERRUPT_AT_CLI_IMPORT = """
import os, runpy, signal, sys, time

class InterruptAtCliImport:  # Ctrl-C while the CLI's modules load
    def find_spec(self, name, path=None, target=None):
        if name == "driver.cli":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)

sys.meta_path.insert(0, InterruptAtCliImport())
sys.argv = ["driver", "generate", "--prompt", "x"]
runpy.run_module("driver", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_starting_exits_130_quietly():
    done = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_CLI_IMPORT], capture_output=True, text=True, cwd=REPO,
                          timeout=25)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")


def test_ctrl_c_while_generating_exits_130_without_a_traceback(tiny_folder, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Generator, "generate", interrupted)
    assert main(generate(tiny_folder)) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_a_node_that_fails_at_run_time_is_a_one_line_error(tiny_folder, tmp_path, capsys):
    """A model file whose node refuses its inputs only when it runs (MRotaryEmbedding's sections that do
    not add up to its rotary dimension): ONNX Runtime's error, named with the file, no traceback."""
    import onnx

    broken = tmp_path / "model"
    broken.mkdir()
    for src in tiny_folder.iterdir():
        if src.name != "model.onnx":
            shutil.copy2(src, broken / src.name)
    model = onnx.load(str(tiny_folder / "model.onnx"), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "MRotaryEmbedding")
    next(a for a in node.attribute if a.name == "mrope_section").ints[:] = [4, 4, 4]
    onnx.save(model, str(broken / "model.onnx"))
    one_line_error(capsys, generate(broken), "model.onnx: ONNX Runtime failed running the model",
                   "MRotaryEmbedding")
