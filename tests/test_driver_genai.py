"""The driver's greedy decoding equals onnxruntime-genai's greedy Generator on the same folder.

The driver runs MatMulNBits as ort_mtp::MatMulNBits (int8 activations at the builder's accuracy_level
4 as ORT's op, but its own quantisation and summation order, and its own attention and linear-attention
ops): not ORT's numbers bit for bit, so the comparison is made on equal graphs: the driver without its rewrite against genai on the builder's
folder, and the driver with it against genai on the folder ops.rewrite made (genai loading our
library through custom_ops_library).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ops.rewrite
from driver import Generator
from driver.identity import SAMPLE_PROMPTS as PROMPTS
from genai_helpers import genai_greedy

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is the reference here")

NEW_TOKENS = 24


# (fixture of the folder the driver runs, of the folder onnxruntime-genai 0.18 loads on CPU: the same
# graphs and weights)
FOLDERS = {
    "models-tiny": ("tiny_folder", "tiny_folder"),  # CPU builds carry no shared_initializers
    "genai-builder": ("builder_folder", "builder_loadable_copy"),
}


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def folders(request, tmp_path_factory):
    ours, loadable = (request.getfixturevalue(name) for name in FOLDERS[request.param])
    rewritten = tmp_path_factory.mktemp("genai-rewritten") / "model"
    assert ops.rewrite.rewrite_folder(loadable, rewritten).count > 0
    return ours, og.Model(str(loadable)), og.Model(str(rewritten))


@pytest.mark.parametrize("rewrite", [True, False], ids=["ort_mtp-matmul", "com.microsoft-matmul"])
def test_greedy_equals_onnxruntime_genai(folders, rewrite):
    folder, reference, rewritten_reference = folders
    reference = rewritten_reference if rewrite else reference
    ours = Generator(folder, provider="cpu", mode="greedy", max_length=128, rewrite=rewrite, threads=1)
    assert (ours.rewritten > 0) == rewrite
    for prompt in PROMPTS:
        ids = ours.encode(prompt)
        expected = genai_greedy(reference, ids, NEW_TOKENS)
        got = ours.generate(ids, NEW_TOKENS).tokens  # both stop at EOS
        assert got == expected, f"greedy diverged from onnxruntime-genai on {prompt!r}"


def test_mtp_equals_genai_greedy(folders):
    folder, _, rewritten_reference = folders
    ours = Generator(folder, provider="cpu", mode="mtp", draft_tokens=3, max_length=128, threads=1)
    for prompt in PROMPTS[:8]:
        ids = ours.encode(prompt)
        assert ours.generate(ids, NEW_TOKENS).tokens == genai_greedy(rewritten_reference, ids, NEW_TOKENS)


def test_cli_on_the_builders_folder(builder_folder, builder_loadable_copy, tmp_path):
    """The command a user runs, on the folder onnxruntime-genai's builder wrote (shared_initializers
    and all): MTP output equals genai's greedy on the same (rewritten) graphs."""
    rewritten = tmp_path / "rewritten"
    ops.rewrite.rewrite_folder(builder_loadable_copy, rewritten)
    done = subprocess.run([sys.executable, "-m", "driver", "generate", "--model", str(builder_folder), "--prompt",
                           "def main():", "--max-new-tokens", "20", "--json", "--threads", "1"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    ours = Generator(builder_folder, provider="cpu", mode="greedy", max_length=64, threads=1)
    assert result["tokens"] == genai_greedy(og.Model(str(rewritten)), ours.encode("def main():"), 20)
