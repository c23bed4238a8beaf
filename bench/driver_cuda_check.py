"""The driver's CUDA path on the device: token identity greedy vs MTP, acceptance, commit branches,
CUDA-graph captures and replays, tok/s. Writes one JSON file and prints a summary.

Two steps, because the device machine has no torch / transformers / onnxruntime-genai:

  1. here (builds onnxruntime-genai's own CUDA export of a tiny random checkpoint, ~20 s):
       python bench/driver_cuda_check.py prepare --dest build/driver-cuda-fixtures
  2. on the GPU machine, with build/driver-cuda-fixtures (a few MB) copied to it:
       python bench/driver_cuda_check.py run --fixtures build/driver-cuda-fixtures --out $OUT

`run` builds the models package's tiny and small presets (int4, CUDA, state_window 4, and tiny
without a window) into a temporary folder, then for every folder:
  - greedy with CUDA graphs off and on (the replayed graphs must give the eager tokens),
  - MTP k = 1, 2, 3 (commit auto: slot promotion, the window exported or added in memory) and k = 3 with commit=replay
    (the snapshot path forced), each compared token for token with greedy,
  - tok/s of greedy and MTP (second, warm pass; median over prompts),
  - CUDA graph runs per graph id, and ORT's own capture/replay log lines from a CLI run,
  - the per-op row identity of a width-4 verify against width-1 decode steps (python -m driver identity),
  - and once, driver.shared_weights: two sessions given one copy of a table read it in place.
`run --provider cpu` is a dry run of the same logic on the CPU EP (CPU folders exported without a
window: the driver's MTP sessions add one in memory, ops.state_window, except with commit=replay).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # driver, models and ops from the checkout

import numpy as np  # noqa: E402
from gpu_timing import out_dir  # noqa: E402  (--out, else $OUT, else bench/results)

PROMPT_LENGTHS = (12, 23, 40, 57, 16, 31, 9, 48)
WINDOW = 4  # state_window of the windowed folders: promotion for k <= 3
# Eager warm-up runs per graph id before ORT captures it: 2 in ORT 1.30's CUDA EP. Only used to
# estimate captures/replays from the driver's own counts; ORT's log lines (ort_graph_log) are the
# observed numbers.
ORT_WARMUP_RUNS = 2


# --------------------------------------------------------------------------------------------------
# prepare (runs where torch + transformers + onnxruntime-genai are installed)


def prepare(dest: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from genai_builder import make_checkpoint, run_genai_builder

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    checkpoint = make_checkpoint(dest / "hf")
    for name, ep, extra in (("genai-cuda-w4", "cuda", f"state_window={WINDOW}"), ("genai-cuda", "cuda", None),
                            ("genai-cpu", "cpu", None)):
        run_genai_builder(checkpoint, dest / name, ep=ep, extra=extra)
        print(f"built {dest / name}")
    shutil.rmtree(dest / "hf")
    shutil.rmtree(dest / "cache", ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# run (the device)


def environment(provider: str) -> dict:
    """Versions and, on CUDA, the GPU (driver.device.describe of the device the Generators use)."""
    import onnxruntime as ort

    import ops
    from driver.device import describe, make_device

    env = {"python": platform.python_version(), "providers": ort.get_available_providers(),
           "library": ops.library_path(), **describe(make_device(provider))}
    try:
        import tokenizers

        env["tokenizers"] = tokenizers.__version__
    except ImportError:
        env["tokenizers"] = None
    return env


def build_presets(work: Path, provider: str, presets: list[str]) -> list[tuple[str, Path]]:
    from models.build import build
    from models.config import BuildOptions, preset

    folders = []
    for name in presets:
        variants = [(f"{name}-w{WINDOW}", WINDOW)] if provider == "cuda" else []
        if name == "tiny" or provider != "cuda":
            variants.append((name, 0))
        for label, window in variants:
            out = work / label
            start = time.perf_counter()
            build(preset(name), out, BuildOptions(precision="int4", ep=provider, state_window=window))
            print(f"built {label} in {time.perf_counter() - start:.1f} s", flush=True)
            folders.append((label, out))
    return folders


def prompts_for(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    high = max(8, vocab - 8)  # stay clear of the special ids at the end of the presets' vocabularies
    return [rng.integers(3, high, size=n).tolist() for n in PROMPT_LENGTHS[:count]]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def graph_summary(graph_runs: dict) -> dict:
    """Per session: runs per graph id (the driver's count), and the captures/replays they imply if
    ORT warms each id up ORT_WARMUP_RUNS times (an estimate; ort_graph_log observes ORT itself)."""
    out = {}
    for session, runs in graph_runs.items():
        runs = {int(k): v for k, v in runs.items()}
        out[session] = {
            "runs_by_graph_id": {str(k): v for k, v in sorted(runs.items())},
            "captured_ids": sorted(k for k, v in runs.items() if v > ORT_WARMUP_RUNS),
            "replays": sum(max(0, v - ORT_WARMUP_RUNS) for v in runs.values()),
            "estimate_assumes_warmup_runs": ORT_WARMUP_RUNS,
        }
    return out


def merge_counts(stats_list, key) -> dict:
    total = {}
    for s in stats_list:
        for k, v in getattr(s, key).items():
            total[k] = total.get(k, 0) + v
    return total


def check_folder(label: str, folder: Path, provider: str, new_tokens: int, prompt_count: int) -> dict:
    """Eager first (the reference, and data even if graph capture fails), then with CUDA graphs."""
    from driver.folder import read_folder

    spec = read_folder(folder)
    prompts = prompts_for(spec.vocab_size, prompt_count)
    max_length = min(spec.context_length, max(map(len, prompts)) + new_tokens + 16)
    report = {"folder": str(folder), "state_window": spec.main.state_window, "vocab": spec.vocab_size,
              "prompts": len(prompts), "new_tokens": new_tokens}
    guarded(report, "eager", check_variant, folder, provider, prompts, new_tokens, max_length, False, None)
    if provider == "cuda":
        reference = report["eager"].get("greedy_tokens")
        guarded(report, "graphs", check_variant, folder, provider, prompts, new_tokens, max_length, True, reference)
    return report


def check_variant(folder: Path, provider: str, prompts, new_tokens: int, max_length: int, graphs: bool,
                  eager_greedy) -> dict:
    """Greedy, MTP k = 1, 2, 3 and MTP k = 3 with commit=replay; every pass twice (the first one
    captures the CUDA graphs), token identity against greedy, tok/s of the second pass."""
    from driver import Generator

    def run_all(gen, **kw):
        return [gen.generate(p, new_tokens, stop_at_eos=False, **kw) for p in prompts]

    # Greedy on a greedy Generator (no state window: a folder exported without one gets one in memory on
    # the MTP Generator only, ops.state_window), so that MTP is compared with what `--mode greedy` prints.
    greedy_gen = Generator(folder, provider=provider, mode="greedy", cuda_graphs=graphs, max_length=max_length)
    greedy_cold = run_all(greedy_gen)
    greedy_warm = run_all(greedy_gen)
    del greedy_gen
    greedy = [r.tokens for r in greedy_warm]
    gen = Generator(folder, provider=provider, mode="mtp", draft_tokens=3, cuda_graphs=graphs,
                    max_length=max_length)
    shared = gen.shared_weights  # driver.shared_weights: None where the device does not share (the CPU)
    report = {"greedy_tokens": greedy, "mtp_session_state_window": gen.main.spec.state_window,
              "shared_bytes": shared.reused_bytes if shared is not None else 0, "greedy": {
        "cold_equal_warm": [a.tokens == b for a, b in zip(greedy_cold, greedy)],
        "tok_s_median": statistics.median(r.stats.tokens_per_second for r in greedy_warm),
    }}
    if eager_greedy is not None:
        report["greedy"]["equal_eager"] = [a == b for a, b in zip(greedy, eager_greedy)]
    runs = {f"mtp_k{k}": (run_all(gen, draft_tokens=k), run_all(gen, draft_tokens=k)) for k in (1, 2, 3)}
    forced = Generator(folder, provider=provider, mode="mtp", draft_tokens=3, cuda_graphs=graphs,
                       max_length=max_length, commit="replay")
    runs["mtp_k3_replay"] = (run_all(forced), run_all(forced))
    for name, (cold, warm) in runs.items():
        stats = [r.stats for r in cold + warm]
        drafted = sum(s.drafted for s in stats)
        accepted = sum(s.accepted for s in stats)
        rounds = sum(s.rounds for s in stats)
        report[name] = {
            "equal_greedy": [r.tokens == g for r, g in zip(warm, greedy)],
            "cold_equal_greedy": [r.tokens == g for r, g in zip(cold, greedy)],
            "first_divergence": [first_divergence(r.tokens, g) for r, g in zip(warm, greedy)],
            "acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_round": sum(s.round_tokens for s in stats) / rounds if rounds else 0.0,
            "commits": merge_counts(stats, "commits"),
            "forwards": merge_counts(stats, "forwards"),
            "tok_s_median": statistics.median(r.stats.tokens_per_second for r in warm),
        }
        report[name]["speedup_vs_greedy"] = report[name]["tok_s_median"] / report["greedy"]["tok_s_median"]
    if graphs:
        report["graph_runs"] = graph_summary({"main": gen.main.graph_runs, "head": gen.head.graph_runs})
        report["graph_runs_replay_policy"] = graph_summary({"main": forced.main.graph_runs,
                                                            "head": forced.head.graph_runs})
    return report


def ort_graph_log(folder: Path, provider: str, new_tokens: int) -> dict:
    """A CLI run with ORT logging at INFO: ORT's own capture/replay messages, counted."""
    env = dict(os.environ, DRIVER_ORT_LOG_LEVEL="1")
    cmd = [sys.executable, "-m", "driver", "generate", "--model", str(folder), "--provider", provider,
           "--prompt", "The quick brown fox jumps over the lazy dog.", "--max-new-tokens", str(new_tokens),
           "--draft-tokens", "3", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    lines = done.stderr.splitlines()
    graph_lines = [line for line in lines
                   if re.search(r"graph", line, re.I) and re.search(r"captur|replay", line, re.I)]
    result = {"returncode": done.returncode,
              "capture_lines": sum(1 for line in graph_lines if re.search(r"captur", line, re.I)),
              "replay_lines": sum(1 for line in graph_lines if re.search(r"replay", line, re.I)),
              "examples": sorted({re.sub(r"^.*?\] ", "", line)[:160] for line in graph_lines})[:6]}
    if done.returncode == 0:
        stats = json.loads(done.stdout.strip().splitlines()[-1])["stats"]
        result["driver_graph_runs"] = graph_summary(stats["graph_runs"])
    else:
        result["stderr_tail"] = done.stderr[-1500:]
    return result


def identity_report(folder: Path, provider: str) -> dict:
    from driver import identity
    from driver.folder import read_folder

    spec = read_folder(folder)
    prompt = prompts_for(spec.vocab_size, 1, seed=1)[0]
    from driver import Generator

    tokens = Generator(spec, provider=provider, mode="greedy", cuda_graphs=False, max_length=128).generate(
        prompt, 4, stop_at_eos=False).tokens
    report = {}
    for rewrite in (True, False):  # ours, then ONNX Runtime's own MatMulNBits kernels
        rows = identity.rows(spec, prompt, tokens, provider=provider, max_length=128, rewrite=rewrite)
        ops_report = identity.per_op(spec, prompt, tokens, provider=provider, rewrite=rewrite)
        report["ort_mtp" if rewrite else "com.microsoft"] = {
            "rows": rows,
            "origins": [{"op": op, "nodes": n, "max_diff": d} for op, n, d in identity.summarize_ops(ops_report)]}
    return report


def shared_weights_check(provider: str) -> dict:
    """driver.shared_weights on the device: two sessions given one copy of a Gather table read it in place
    (a change to the copy shows in both outputs), i.e. ORT took the copy on its device rather than
    falling back (with a logged warning) to loading the table again for each session."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from driver.device import make_device
    from driver.sessions import EXTERNAL_DATA_FOLDER
    from driver.shared_weights import SharedWeights

    device = make_device(provider, graph_capture=False)
    table = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float16)  # 1 MiB: shared
    ids = np.array([3, 700], np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "w.data").write_bytes(table.tobytes())
        t = TensorProto(name="E", data_type=TensorProto.FLOAT16, dims=table.shape, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", "w.data"), ("offset", "0"), ("length", str(table.nbytes))):
            t.external_data.add(key=key, value=value)
        graph = helper.make_graph([helper.make_node("Gather", ["E", "ids"], ["y"])], "g",
                                  [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [None, 512])], [t])
        proto = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
        shared = SharedWeights(device, {"E"})
        sessions, given = [], []
        for _ in range(2):
            options = ort.SessionOptions()
            options.log_severity_level = 3
            given.append(sorted(shared.add_to(options, proto, folder)))
            options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(folder))
            device.session_options(options)
            sessions.append(ort.InferenceSession(proto.SerializeToString(), options, providers=device.providers(False)))
        before = [s.run(None, {"ids": ids})[0] for s in sessions]
        with device.active():
            shared._copies["E"].array[ids] = 0
        device.synchronize()
        after = [s.run(None, {"ids": ids})[0] for s in sessions]
    return {"given": given, "reused_bytes": shared.reused_bytes,
            "equal_before": all(np.array_equal(b, table[ids]) for b in before),
            "in_place": all(bool((a == 0).all()) for a in after)}


def guarded(results: dict, key: str, fn, *args):
    start = time.perf_counter()
    try:
        results[key] = fn(*args)
    except Exception as e:  # record and go on: one failing folder must not hide the others
        results[key] = {"error": f"{type(e).__name__}: {e}".splitlines()[0],
                        "traceback": traceback.format_exc()[-3000:]}
    results[key]["seconds"] = round(time.perf_counter() - start, 2)
    print(f"{key}: done in {results[key]['seconds']} s", flush=True)


def summary_lines(report: dict) -> list[str]:
    lines = []
    for label, r in report["folders"].items():
        if "error" in r:
            lines.append(f"{label}: ERROR {r['error']}")
            continue
        for variant in ("eager", "graphs"):
            v = r.get(variant)
            if v is None:
                continue
            if "error" in v:
                lines.append(f"{label} [{variant}]: ERROR {v['error']}")
                continue
            g = v["greedy"]
            extra = f", ==eager {sum(g['equal_eager'])}/{len(g['equal_eager'])}" if "equal_eager" in g else ""
            lines.append(f"{label} [{variant}] (W={r['state_window']}, MTP session W={v['mtp_session_state_window']}, "
                         f"head shares {v.get('shared_bytes', 0) / 1e6:.1f} MB): greedy {g['tok_s_median']:.1f} tok/s{extra}")
            for name in ("mtp_k1", "mtp_k2", "mtp_k3", "mtp_k3_replay"):
                m = v[name]
                lines.append(f"  {name}: ==greedy {sum(m['equal_greedy'])}/{len(m['equal_greedy'])}, acceptance "
                             f"{m['acceptance']:.3f}, {m['tokens_per_round']:.2f} tok/round, "
                             f"{m['tok_s_median']:.1f} tok/s (x{m['speedup_vs_greedy']:.2f}), commits {m['commits']}")
            if "graph_runs" in v:
                gr = v["graph_runs"]
                lines.append(f"  graph ids run past warm-up (estimate): main {len(gr['main']['captured_ids'])} ids, "
                             f"{gr['main']['replays']} replays; head {len(gr['head']['captured_ids'])} ids, "
                             f"{gr['head']['replays']} replays")
    w = report.get("shared_weights")
    if w is not None:
        lines.append(f"shared weights: ERROR {w['error']}" if "error" in w else
                     f"shared weights: given {w['given']}, first session's values {w['equal_before']}, read in place "
                     f"by both sessions {w['in_place']}")
    for label, r in report.get("ort_log", {}).items():
        lines.append(f"{label} ORT log: rc {r.get('returncode')}, capture lines {r.get('capture_lines')}, "
                     f"replay lines {r.get('replay_lines')}" + (f" ERROR {r['error']}" if "error" in r else ""))
    for label, r in report.get("identity", {}).items():
        if "error" in r:
            lines.append(f"{label} identity: ERROR {r['error']}")
            continue
        for matmul in ("ort_mtp", "com.microsoft"):
            rows = r[matmul]["rows"]
            origins = [(o["op"], float("%.3g" % o["max_diff"])) for o in r[matmul]["origins"]]
            lines.append(f"{label} identity, {matmul} MatMulNBits (width 4): logits rows equal "
                         f"{rows['logits_rows_equal']}, argmax equal {rows['argmax_equal']}, kv diff "
                         f"{rows['kv_max_diff']:.3g}, state diff {rows['state_max_diff']:.3g}, origins {origins}")
    return lines


def run(args) -> int:
    provider = args.provider
    out = out_dir(args.out)
    report = {"provider": provider, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "folders": {},
              "ort_log": {}, "identity": {}}
    guarded(report, "environment", environment, provider)
    guarded(report, "shared_weights", shared_weights_check, provider)
    work = Path(tempfile.mkdtemp(prefix="driver-cuda-check-"))
    try:
        folders = build_presets(work, provider, args.presets.split(","))
        fixtures = Path(args.fixtures) if args.fixtures else None
        wanted = ("genai-cuda-w4", "genai-cuda") if provider == "cuda" else ("genai-cpu",)
        for name in wanted:
            if fixtures and (fixtures / name / "genai_config.json").is_file():
                folders.append((name, fixtures / name))
            else:
                report["folders"][name] = {"error": f"fixture {name} not found under {fixtures} (run `prepare`)"}
        for label, folder in folders:
            count = args.prompts if not label.startswith("small") else max(2, args.prompts // 2)
            guarded(report["folders"], label, check_folder, label, folder, provider, args.new_tokens, count)
        for label, folder in folders:
            if not label.startswith("small"):
                guarded(report["ort_log"], label, ort_graph_log, folder, provider, 48)
                guarded(report["identity"], label, identity_report, folder, provider)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path = out / f"driver_{provider}_check.json"
    path.write_text(json.dumps(report, indent=1))
    print("\n".join(summary_lines(report)))
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare",
                       help="build onnxruntime-genai fixtures (needs torch, transformers, onnxruntime-genai)")
    p.add_argument("--dest", default=str(ROOT / "build" / "driver-cuda-fixtures"))
    r = sub.add_parser("run", help="run the checks")
    r.add_argument("--fixtures", default=str(ROOT / "build" / "driver-cuda-fixtures"))
    r.add_argument("--out", help="result folder (default $OUT, else bench/results)")
    r.add_argument("--provider", choices=("cuda", "cpu"), default="cuda", help="cpu: dry run on the CPU EP")
    r.add_argument("--presets", default="tiny,small")
    r.add_argument("--prompts", type=int, default=6, help="prompts per folder (small: half)")
    r.add_argument("--new-tokens", type=int, default=80)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(Path(args.dest))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
