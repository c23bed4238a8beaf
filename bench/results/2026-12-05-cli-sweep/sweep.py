"""Command-line mistakes against the three commands (python -m driver, ops, models): every case must end
with a one-line error or a normal run, never a traceback, a signal, a hang (180 s), or a change to the
model folder. Run from a checkout (its packages are what runs):

    python bench/results/2026-12-05-cli-sweep/sweep.py --model <tiny preset folder, CPU int4> [CASE ...]

One line per case: BAD where it failed that rule; rc and the last stderr line either way."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
args = sys.argv[1:]
if len(args) < 2 or args[0] != "--model":
    sys.exit(__doc__)
TINY = Path(args[1]).resolve()
W = Path(tempfile.mkdtemp(prefix="clifuzz"))
(W / "empty").mkdir()
(W / "afile").write_text("x")
(W / "notjson").mkdir()
(W / "notjson" / "genai_config.json").write_text("{")
(W / "user").mkdir()  # a folder that is not one of our builds: --overwrite must refuse it
(W / "user" / "genai_config.json").write_text("{}")
(W / "user" / "notes.txt").write_text("keep me")
bigprompt = "word " * 20000

def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()

G = ["-m", "driver", "generate", "--model", str(TINY)]
cases = {
    "mnt0": G + ["--prompt", "a", "--max-new-tokens", "0"],
    "mnt-1": G + ["--prompt", "a", "--max-new-tokens", "-1"],
    "mnthuge": G + ["--prompt", "a", "--max-new-tokens", str(10**12)],
    "mntstr": G + ["--prompt", "a", "--max-new-tokens", "abc"],
    "mntfloat": G + ["--prompt", "a", "--max-new-tokens", "1e3"],
    "dt0": G + ["--prompt", "a", "--draft-tokens", "0"],
    "dt9": G + ["--prompt", "a", "--draft-tokens", "9"],
    "dtgreedy": G + ["--prompt", "a", "--mode", "greedy", "--draft-tokens", "3"],
    "nomodel": ["-m", "driver", "generate", "--model", str(W / "nope"), "--prompt", "a"],
    "modelfile": ["-m", "driver", "generate", "--model", str(W / "afile"), "--prompt", "a"],
    "modelempty": ["-m", "driver", "generate", "--model", str(W / "empty"), "--prompt", "a"],
    "modelbadjson": ["-m", "driver", "generate", "--model", str(W / "notjson"), "--prompt", "a"],
    "emptyprompt": G + ["--prompt", ""],
    "bigprompt": G + ["--prompt", bigprompt, "--max-new-tokens", "2"],
    "pc0": G + ["--prompt", "a", "--prefill-chunk", "0"],
    "pc-1": G + ["--prompt", "a", "--prefill-chunk", "-1"],
    "pchuge": G + ["--prompt", "a", "--prefill-chunk", str(10**9)],
    "th0": G + ["--prompt", "a", "--threads", "0"],
    "th1000": G + ["--prompt", "a", "--threads", "1000"],
    "tneg": G + ["--prompt", "a", "--temperature", "-1"],
    "tnan": G + ["--prompt", "a", "--temperature", "nan"],
    "tinf": G + ["--prompt", "a", "--temperature", "inf"],
    "tbig": G + ["--prompt", "a", "--temperature", "1e308"],
    "ttiny": G + ["--prompt", "a", "--temperature", "1e-45", "--max-new-tokens", "4"],
    "topk-1": G + ["--prompt", "a", "--temperature", "1", "--top-k", "-1"],
    "topkbig": G + ["--prompt", "a", "--temperature", "1", "--top-k", str(10**20)],
    "topp0": G + ["--prompt", "a", "--temperature", "1", "--top-p", "0"],
    "topp2": G + ["--prompt", "a", "--temperature", "1", "--top-p", "1.5"],
    "toppnan": G + ["--prompt", "a", "--temperature", "1", "--top-p", "nan"],
    "topk_greedy": G + ["--prompt", "a", "--top-k", "5"],
    "seed-1": G + ["--prompt", "a", "--temperature", "1", "--seed", "-1"],
    "seedbig": G + ["--prompt", "a", "--temperature", "1", "--seed", str(2**64)],
    "seedstr": G + ["--prompt", "a", "--seed", "x"],
    "cuda": G + ["--prompt", "a", "--provider", "cuda", "--max-new-tokens", "2"],
    "replaygreedy": G + ["--prompt", "a", "--mode", "greedy", "--commit", "replay", "--max-new-tokens", "2"],
    "nul": G + ["--prompt", "a\x01b\x7f", "--max-new-tokens", "2"],
    "surrogate_env": G + ["--prompt", "a", "--max-new-tokens", "2", "--json"],
    "id_w0": ["-m", "driver", "identity", "--model", str(TINY), "--width", "0"],
    "id_w100": ["-m", "driver", "identity", "--model", str(TINY), "--width", "100"],
    "id_w-1": ["-m", "driver", "identity", "--model", str(TINY), "--width", "-1"],
    "id_nt0": ["-m", "driver", "identity", "--model", str(TINY), "--streams", "--new-tokens", "0"],
    "id_nthuge": ["-m", "driver", "identity", "--model", str(TINY), "--streams", "--new-tokens", str(10**12)],
    "id_emptyprompt": ["-m", "driver", "identity", "--model", str(TINY), "--prompt", ""],
    "id_nomodel": ["-m", "driver", "identity", "--model", str(W / "nope")],
    "rw_same": ["-m", "ops", "rewrite", str(TINY), str(TINY)],
    "rw_inside": ["-m", "ops", "rewrite", str(TINY), str(TINY / "sub")],
    "rw_missing": ["-m", "ops", "rewrite", str(W / "nope"), str(W / "o1")],
    "rw_file_to_folder": ["-m", "ops", "rewrite", str(TINY / "model.onnx"), str(W / "o2")],
    "rw_datafile": ["-m", "ops", "rewrite", str(TINY / "model.onnx.data"), str(W / "o3.onnx")],
    "rw_out_file_exists": ["-m", "ops", "rewrite", str(TINY), str(W / "afile")],
    "rw_badonly": ["-m", "ops", "rewrite", "--only", "nope", str(TINY), str(W / "o4")],
    "rw_badre": ["-m", "ops", "rewrite", "--include", "re:(", str(TINY), str(W / "o5")],
    "rw_badlib": ["-m", "ops", "rewrite", "--library", str(W / "afile"), str(TINY), str(W / "o6")],
    "rw_empty_in": ["-m", "ops", "rewrite", str(W / "empty"), str(W / "o7")],
    "rw_out_in_parent_missing": ["-m", "ops", "rewrite", str(TINY), str(W / "no" / "such" / "dir")],
    "rw_onnx_to_dir": ["-m", "ops", "rewrite", str(TINY / "model.onnx"), str(W / "empty")],
    "mb_badpreset": ["-m", "models", "build", "--preset", "nope", "--out", str(W / "b1")],
    "mb_sw-1": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b2"), "--state-window", "-1"],
    "mb_swhuge": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b3"), "--state-window", str(10**9)],
    "mb_noise-1": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b4"), "--mtp-noise", "-1"],
    "mb_noisenan": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b5"), "--mtp-noise", "nan"],
    "mb_outscale0": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b6"), "--out-scale", "0"],
    "mb_outscaleinf": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b6b"), "--out-scale", "inf"],
    "mb_th0": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b7"), "--threads", "0"],
    "mb_seed-1": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b8"), "--seed", "-1"],
    "mb_seedbig": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b9"), "--seed", str(2**70)],
    "mb_out_file": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "afile")],
    "mb_out_model": ["-m", "models", "build", "--preset", "tiny", "--out", str(TINY)],
    "mb_overwrite_user": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "user"), "--overwrite"],
    "mb_prec": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b10"), "--precision", "int8"],
    "mb_ep": ["-m", "models", "build", "--preset", "tiny", "--out", str(W / "b11"), "--ep", "tpu"],
    "acc_p0": ["-m", "models", "acceptance", str(TINY), "--prompts", "0"],
    "acc_pl0": ["-m", "models", "acceptance", str(TINY), "--prompt-length", "0"],
    "acc_nt0": ["-m", "models", "acceptance", str(TINY), "--new-tokens", "0"],
    "acc_nthuge": ["-m", "models", "acceptance", str(TINY), "--new-tokens", str(10**9)],
    "acc_seed-1": ["-m", "models", "acceptance", str(TINY), "--seed", "-1"],
    "acc_nomodel": ["-m", "models", "acceptance", str(W / "nope")],
    "hf_out_model": ["-m", "models", "head-folder", str(TINY), str(TINY)],
    "hf_help": ["-m", "models", "head-folder", "--help"],
    "tr_steps0": ["-m", "models", "train", "--out", str(W / "t1"), "--shape", "train-test", "--steps", "0"],
    "tr_bad_shape": ["-m", "models", "train", "--out", str(W / "t2"), "--shape", "nope"],
    "tr_min-1": ["-m", "models", "train", "--out", str(W / "t3"), "--shape", "train-test", "--minutes", "-1"],
    "tr_batch0": ["-m", "models", "train", "--out", str(W / "t4"), "--shape", "train-test", "--batch", "0", "--steps", "1"],
    "tr_seq0": ["-m", "models", "train", "--out", str(W / "t5"), "--shape", "train-test", "--seq-len", "0", "--steps", "1"],
    "tr_out_file": ["-m", "models", "train", "--out", str(W / "afile"), "--shape", "train-test", "--steps", "1"],
    "tr_corpus0": ["-m", "models", "train", "--out", str(W / "t6"), "--shape", "train-test", "--corpus-mb", "0", "--steps", "1"],
    "tok_help": ["-m", "models", "tokenizer", "--help"],
    "conv_missing": ["-m", "models", "convert", str(W / "nope"), str(W / "c1")],
    "conv_file": ["-m", "models", "convert", str(W / "afile"), str(W / "c2")],
    "sweep_help": ["-m", "models", "sweep", "--help"],
    "ops_info": ["-m", "ops", "info"],
}
only = args[2:]
if only:
    cases = {k: v for k, v in cases.items() if k in only}
before = digest(TINY)

def run(item):
    name, argv = item
    try:
        r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=180,
                           env={**os.environ, "PYTHONWARNINGS": "ignore"})
        err = r.stderr
        bad = "Traceback" in err or "Traceback" in r.stdout or r.returncode < 0
        return name, r.returncode, bad, (err.strip().splitlines() or [""])[-1][:300], r.stdout[-200:]
    except subprocess.TimeoutExpired:
        return name, None, True, "TIMEOUT", ""

with ThreadPoolExecutor(2) as pool:
    for name, rc, bad, last, out in pool.map(run, cases.items()):
        print(f"{'BAD ' if bad else '    '}{name:24s} rc={rc} {last!r}" + (f" OUT={out!r}" if rc == 0 else ""), flush=True)
after = digest(TINY)
print("model folder unchanged" if before == after else "MODEL FOLDER CHANGED")
print("user folder kept" if (W / "user" / "notes.txt").read_text() == "keep me" else "USER FOLDER CHANGED")
shutil.rmtree(W, ignore_errors=True)
