"""models.train on a tiny shape and a small slice of this machine's Python source: the corpus split,
the loss going down, a resumed run equal to an uninterrupted one bit for bit, the weight shards, the
folder rules, and the exported checkpoint through onnxruntime-genai's builder into a folder the driver
runs (MTP == greedy)."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch", reason="training needs torch")
pytest.importorskip("transformers", reason="training needs transformers")

from models.train import corpus  # noqa: E402
from models.train.train import TrainError, TrainOptions, export_checkpoint, train, write_shards  # noqa: E402

OPTIONS = TrainOptions(shape="train-test", seq_len=32, batch=2, lr=3e-3, warmup_steps=2, total_steps=40,
                       eval_every=20, corpus_bytes=1_500_000, threads=1)


def test_split_is_by_file_and_stable():
    files = corpus.python_files(limit_bytes=3_000_000)
    train_files, held = corpus.split(files)
    assert held and train_files and len(held) + len(train_files) == len(files)
    assert {f.name for f in held}.isdisjoint(f.name for f in train_files)
    # the same name is held out on any machine: the split is a function of the name alone
    assert all(corpus.SourceFile(f.name, f.path).held_out for f in held)
    assert 0.01 < len(held) / len(files) < 0.15


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "run"
    train(out, OPTIONS, steps=40, log=lambda _: None)
    return out


def test_loss_goes_down_and_is_logged(run):
    log = json.loads((run / "log.json").read_text())
    evals = log["evaluations"]
    assert [e["step"] for e in evals] == [20, 40]
    assert evals[-1]["tokens_seen"] == 40 * OPTIONS.batch * OPTIONS.seq_len
    assert evals[-1]["heldout_loss"] < math.log(512) - 0.5  # well below a uniform guess over the vocabulary
    assert evals[-1]["heldout_mtp_loss"] < math.log(512) - 0.3
    manifest = json.loads((run / "corpus.json").read_text())
    assert any(f["held_out"] for f in manifest) and any(not f["held_out"] for f in manifest)
    assert all(p.stat().st_size < 16_000_000 for p in (run / "weights").glob("*.safetensors"))


def test_resumed_run_equals_an_uninterrupted_one(tmp_path):
    options = TrainOptions(**{**OPTIONS.__dict__, "total_steps": 6, "eval_every": 3})
    straight, pieces = tmp_path / "straight", tmp_path / "pieces"
    train(straight, options, log=lambda _: None)
    train(pieces, options, steps=4, log=lambda _: None)
    train(pieces, options, log=lambda _: None)  # continues from step 4 to the schedule's end
    a = torch.load(straight / "state" / "state.pt", weights_only=True)
    b = torch.load(pieces / "state" / "state.pt", weights_only=True)
    assert a["step"] == b["step"] == 6
    for part in ("model", "head"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)


def test_shards_stay_under_the_limit(tmp_path):
    model, inner = torch.nn.Module(), torch.nn.Module()
    model.add_module("model", inner)  # keys model.w0 .. model.w4, as Qwen3_5ForCausalLM's
    for i in range(5):  # 5 x 6 MB of bfloat16
        inner.register_parameter(f"w{i}", torch.nn.Parameter(torch.zeros(3 * 1024 * 1024)))
    head = torch.nn.Module()
    paths = write_shards(tmp_path / "w", model, head)
    assert len(paths) == 3 and all(p.stat().st_size < 16_000_000 for p in paths)


def test_folder_rules(tmp_path, run):
    other = tmp_path / "model"
    other.mkdir()
    (other / "genai_config.json").write_text("{}")
    with pytest.raises(TrainError, match="is not a training run"):
        train(other, OPTIONS, steps=1)
    assert [p.name for p in other.iterdir()] == ["genai_config.json"]  # nothing written into it
    with pytest.raises(TrainError, match="started with other options"):
        train(run, TrainOptions(**{**OPTIONS.__dict__, "lr": 1e-2}), steps=1)
    with pytest.raises(TrainError, match="unknown shape"):
        train(tmp_path / "new", TrainOptions(shape="huge"))
    assert not (tmp_path / "new").exists()
    with pytest.raises(TrainError, match="exists and is not empty|not empty"):
        export_checkpoint(run, other)  # a folder with files in it is never written into
    assert [p.name for p in other.iterdir()] == ["genai_config.json"]
    with pytest.raises(TrainError, match="inside the source folder"):
        export_checkpoint(run, run / "hf")


def test_exported_checkpoint_converts_and_runs(run, tmp_path):
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai's builder converts the checkpoint")
    from driver import Generator
    from models.convert import convert

    hf = export_checkpoint(run, tmp_path / "hf")
    assert (hf / "config.json").is_file() and (hf / "mtp.safetensors").is_file()
    folder = tmp_path / "onnx"
    convert(str(hf), str(folder), precision="int4", ep="cpu")
    gen = Generator(folder, provider="cpu", mode="mtp", max_length=128, threads=1)
    prompt = "def read_config(path):\n    "
    greedy = gen.generate(prompt, 24, mode="greedy", stop_at_eos=False)
    for k in (1, 3):
        assert gen.generate(prompt, 24, draft_tokens=k, stop_at_eos=False).tokens == greedy.tokens
