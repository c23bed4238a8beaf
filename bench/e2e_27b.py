"""End-to-end generation on the 27B-class synthetic model, on the device: the driver's greedy and
MTP (k = 1, 2, 3) with our MatMulNBits (the rewrite) and with ONNX Runtime's own (no rewrite),
onnxruntime-genai's greedy Generator and C++ MtpGenerator on the same folder and prompts (when
onnxruntime_genai imports), token identity of each MTP stream against the greedy stream of the
same configuration, and the per-op row identity of a width-4 verify on CUDA
(`python -m driver identity`).

    python3 bench/e2e_27b.py [--folder /tmp/models_qwen35_27b] [--prompts 4] [--new-tokens 128]
                             [--repetitions 3] [--ort-repetitions 1] [--phases] [--temperatures 0.7,1.0]

Builds the folder first when it is missing (`qwen35-27b`, int4, CUDA, --state-window 5 slots so that
k = 4's verify commits without a re-advance; ~25 s on 16 cores; `--state-window 0` builds it without a
window, which the driver's MTP Generator then adds in memory). Greedy runs on a greedy Generator and
MTP on one Generator with draft_tokens 4, per configuration. Each (configuration, mode) runs every prompt once to warm up (CUDA graphs captured), then
--repetitions measured passes; tok/s is the median over prompts of each prompt's median new tokens /
decode seconds, beside the time to first token (the prefill), the achieved weight bandwidth (weight
bytes read by the forwards over the decode time), the memory each of the two Generators adds (what a
run of that mode needs; on the CPU the process's resident memory) and both together at the peak, and, with
--phases, ms per round per phase from one profiled pass. With genai, our greedy stream is compared
with genai's greedy stream per prompt (greedy_vs_ours: the first differing token, or null). Writes
$OUT/e2e_27b.json (else bench/results/e2e_27b.json) and prints a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from cpu import git_revision  # noqa: E402  (bench/cpu.py: the revision, "-dirty" with uncommitted changes)
from gpu_timing import out_dir  # noqa: E402  (--out, else $OUT, else bench/results)

from ops.rewrite import REWRITES  # noqa: E402

MODES = (("greedy", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3), ("mtp", 4))
ACCEPTED_PER_DRAFTED = "accepted / drafted"  # what every acceptance in the JSON is (the genai section says it too)
MAIN_FORWARDS = ("decode", "verify", "re-advance")  # forwards of the main graph after the prompt's


def ensure_folder(folder: Path, state_window: int, mtp_noise: float | None = None,
                  out_scale: float | None = None) -> dict:
    """Builds the qwen35-27b folder when it is missing. `mtp_noise` and `out_scale` (the synthetic weights'
    acceptance knobs, models build's defaults when None: docs/models.md) apply to a build only: a folder
    does not record the knobs it was built with, so an existing one is refused rather than reported under
    knobs it may not have."""
    knobs = {name: value for name, value in (("mtp_noise", mtp_noise), ("out_scale", out_scale)) if value is not None}
    if (folder / "genai_config.json").is_file():
        if knobs:
            given = ", ".join(f"--{name.replace('_', '-')} {value:g}" for name, value in knobs.items())
            raise SystemExit(f"{given}: {folder} already exists and does not record how it was built; "
                             "pass a --folder that does not exist yet")
        from driver.folder import read_folder

        return {"built": False, "state_window": read_folder(folder).main.state_window}
    start = time.perf_counter()
    options = [arg for name, value in knobs.items() for arg in (f"--{name.replace('_', '-')}", str(value))]
    subprocess.run([sys.executable, "-m", "models", "build", "--preset", "qwen35-27b", "--out", str(folder),
                    "--precision", "int4", "--ep", "cuda", "--state-window", str(state_window), *options, "--overwrite"],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return {"built": True, "seconds": round(time.perf_counter() - start, 1), "state_window": state_window, **knobs}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize(per_prompt: list[dict], k: int) -> dict:
    """One (configuration, mode) row: median tok/s over prompts; for MTP, mean acceptance and how many
    prompts' streams equal the greedy stream."""
    row = {"tok_s_median": statistics.median(e["tok_s"] for e in per_prompt), "prompts": per_prompt}
    if k:
        row["acceptance_mean"] = statistics.fmean(e["acceptance"] for e in per_prompt)
        row["identical_to_greedy"] = sum(e["first_difference_from_greedy"] is None for e in per_prompt)
    return row


def tiles_folder(folder: Path) -> tuple[Path, dict]:
    """The folder rewritten by `python -m ops rewrite --pack` (made once, next to it): every
    MatMulNBits on our op, the weights of those the tiles layout takes packed (packing=1)."""
    from ops.rewrite import rewrite_folder

    target = folder.with_name(folder.name + "_tiles")
    if (target / "genai_config.json").is_file():
        return target, {"built": False}
    start = time.perf_counter()
    report = rewrite_folder(folder, target, pack=True)
    packed = {name: {"packed": r.packed, "not_packed": len(r.not_packed)} for name, r in report.models.items()}
    return target, {"built": True, "seconds": round(time.perf_counter() - start, 1), "models": packed}


def run_sampled(by_mode: dict, prompts: list[list[int]], new_tokens: int, temperature: float, label: str) -> dict:
    """Sampled decoding at `temperature` (no top-k / top-p): plain sampling (mode greedy) and MTP
    speculative sampling k = 1..3, each prompt with its own fixed seed, warm-up pass then the measured
    one. Rows as summarize's, without stream identity (sampled streams need not match: docs/driver.md)."""
    rows = {}
    for mode, k in MODES:
        per_prompt = []
        for p, ids in enumerate(prompts):
            kwargs = {"mode": mode, "stop_at_eos": False, "temperature": temperature, "seed": 1000 + p}
            if k:
                kwargs["draft_tokens"] = k
            by_mode[mode].generate(ids, new_tokens, **kwargs)
            stats = by_mode[mode].generate(ids, new_tokens, **kwargs).stats.as_dict()
            per_prompt.append({"tok_s": stats["tokens_per_second"], "acceptance": stats["acceptance"],
                               "tokens_per_round": stats["tokens_per_round"]})
        name = "sample" if not k else f"mtp_k{k}"
        row = {"tok_s_median": statistics.median(e["tok_s"] for e in per_prompt), "prompts": per_prompt}
        if k:
            row["acceptance_mean"] = statistics.fmean(e["acceptance"] for e in per_prompt)
            row["tokens_per_round_mean"] = statistics.fmean(e["tokens_per_round"] for e in per_prompt)
        rows[name] = row
        print(f"  {label:5s} T={temperature:<4} {name:8s} {row['tok_s_median']:8.1f} tok/s"
              + (f"  acceptance {row['acceptance_mean']:.3f}" if k else ""), flush=True)
    return rows


def weight_bytes(folder: Path) -> dict:
    """Bytes of weights a forward of each graph reads: its external data files (int4 weights, scales,
    embeddings; the tiles layout's file where the rewrite wrote one)."""
    def data(name):
        return sum(p.stat().st_size for p in folder.glob(f"{name}.onnx*.data"))
    return {"main": data("model"), "head": data("mtp")}


def memory_used(provider: str, release: bool = False) -> int | None:
    """Bytes in use where the provider keeps the weights: on CUDA the GPU's used memory (all of this
    process's allocations, ONNX Runtime's and CuPy's pool included), on the CPU this process's resident
    memory. None where it cannot be read. `release`: first hand back what CuPy's pool keeps cached from
    an earlier configuration (never between timed passes: the next pass would allocate it again)."""
    if provider == "cpu":
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):  # not Linux: not measured
            return None
    try:
        import cupy

        if release:
            cupy.get_default_memory_pool().free_all_blocks()
        free, total = cupy.cuda.runtime.memGetInfo()
        return int(total - free)
    except Exception:  # noqa: BLE001 - no CuPy or no GPU: not measured
        return None


def grown(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def run_configuration(folder: Path, provider: str, rewrite, prompts: list[list[int]], new_tokens: int,
                      label: str | None = None, temperatures: tuple[float, ...] = (), repetitions: int = 1,
                      phases: bool = False) -> dict:
    """Every mode on every prompt: a warm-up pass (captures this width's CUDA graphs), then `repetitions`
    measured passes; per prompt the medians of decode tok/s and time to first token (the prefill) and
    the achieved weight bandwidth (weight bytes read by the main and head forwards over the decode
    time). With `phases`, one more pass with the profiler (a device synchronisation per phase, so not
    the timed one) gives ms per round per phase."""
    from driver import Generator

    label = label or ("ours" if rewrite else "ort")

    # Greedy on a greedy Generator, as `--mode greedy` runs it, and MTP on one whose draft_tokens is the
    # largest k measured: a folder exported without a state window gets k+1 slots in memory on the MTP
    # Generator only (ops.state_window), the window of a folder exported with W = 5. Each holds its own
    # sessions, weights included: the memory each adds (loaded and warmed up, its CUDA graphs captured)
    # is what a user's run of that mode needs; the peak is both at once, which no user run holds.
    gc.collect()
    before = memory_used(provider, release=True)
    start = time.perf_counter()
    gen = Generator(folder, provider=provider, mode="mtp", draft_tokens=max(k for _, k in MODES), rewrite=rewrite)
    load_seconds = time.perf_counter() - start
    by_mode = {"mtp": gen}
    gen_report = rewrite_summary(gen, rewrite)
    mtp_window = gen.main.spec.state_window
    bytes_per = weight_bytes(folder)
    rows = {}
    greedy_tokens = []

    def run(mode, k, ids, generator=None):
        return (generator or by_mode[mode]).generate(ids, new_tokens, mode=mode, stop_at_eos=False,
                                                     **({"draft_tokens": k} if k else {}))

    def warm_up(modes):  # captures every width's CUDA graphs
        for mode, k in modes:
            for ids in prompts:
                run(mode, k, ids)

    warm_up([m for m in MODES if m[0] == "mtp"])
    with_mtp = memory_used(provider)
    by_mode["greedy"] = greedy_gen = Generator(folder, provider=provider, mode="greedy", rewrite=rewrite)
    warm_up([m for m in MODES if m[0] == "greedy"])
    peak = with_both = memory_used(provider)
    memory = {"mtp_generator": grown(before, with_mtp), "greedy_generator": grown(with_mtp, with_both)}
    # The measured passes go repetition by repetition over every mode and prompt, so that a drift of the
    # machine during the run (clocks, temperature, a neighbour's load) falls on every mode alike rather
    # than on the modes timed last.
    passes = {(mode, k, p): [] for mode, k in MODES for p in range(len(prompts))}
    for _ in range(repetitions):
        for mode, k in MODES:
            for p, ids in enumerate(prompts):
                passes[(mode, k, p)].append(run(mode, k, ids))
    for mode, k in MODES:
        per_prompt = []
        for p, ids in enumerate(prompts):
            runs = passes[(mode, k, p)]
            result = runs[-1]
            stats = result.stats.as_dict()
            forwards = stats["forwards"]
            main = sum(forwards.get(name, 0) for name in MAIN_FORWARDS)
            gbps = (bytes_per["main"] * main + bytes_per["head"] * forwards.get("head", 0)) / stats["decode_seconds"] / 1e9
            entry = {"tok_s": statistics.median(r.stats.as_dict()["tokens_per_second"] for r in runs),
                     "tok_s_runs": [r.stats.as_dict()["tokens_per_second"] for r in runs],
                     "ttft_ms": 1000 * statistics.median(r.stats.as_dict()["prefill_seconds"] for r in runs),
                     "weight_gb_s": round(gbps, 1), "acceptance": stats["acceptance"],
                     "tokens_per_round": stats["tokens_per_round"], "commits": stats["commits"], "forwards": forwards,
                     "tokens": result.tokens}  # kept so that a stream difference can be looked at afterwards
            if any(r.tokens != result.tokens for r in runs):
                entry["repetitions_differ"] = True  # the same inputs gave different tokens: nondeterminism
            if mode == "greedy":
                greedy_tokens.append(result.tokens)
            else:
                entry["first_difference_from_greedy"] = first_difference(result.tokens, greedy_tokens[p])
            per_prompt.append(entry)
            used = memory_used(provider)
            peak = max(peak, used) if peak is not None and used is not None else peak
        name = mode if not k else f"mtp_k{k}"
        rows[name] = row = summarize(per_prompt, k)
        row["ttft_ms_median"] = statistics.median(e["ttft_ms"] for e in per_prompt)
        row["weight_gb_s_median"] = statistics.median(e["weight_gb_s"] for e in per_prompt)
        print(f"  {label:5s} {name:8s} {row['tok_s_median']:8.1f} tok/s  ttft {row['ttft_ms_median']:.1f} ms  "
              f"{row['weight_gb_s_median']:.0f} GB/s"
              + (f"  acceptance {row['acceptance_mean']:.3f}  ==greedy {row['identical_to_greedy']}/{len(prompts)}"
                 if k else ""), flush=True)
    if phases:
        profiled = Generator(folder, provider=provider, mode="mtp", rewrite=rewrite, profile=True)
        for mode, k in MODES:
            run(mode, k, prompts[0], profiled)
            stats = run(mode, k, prompts[0], profiled).stats.as_dict()
            rows[mode if not k else f"mtp_k{k}"]["phase_ms_per_round"] = stats.get("phase_ms_per_round")
        del profiled
    sampled = {str(t): run_sampled(by_mode, prompts, new_tokens, t, label) for t in temperatures}
    del gen, greedy_gen, by_mode
    memory["peak_both"] = grown(before, peak)
    if None not in memory.values():
        print(f"  {label:5s} memory added: MTP Generator {memory['mtp_generator'] / 1e9:.2f} GB, greedy Generator "
              f"{memory['greedy_generator'] / 1e9:.2f} GB, both at the peak {memory['peak_both'] / 1e9:.2f} GB", flush=True)
    out = {"label": label, "rewrite": rewrite if isinstance(rewrite, bool) else list(rewrite),
           "rewritten": gen_report, "load_seconds": round(load_seconds, 1), "weight_bytes": bytes_per,
           "mtp_session_state_window": mtp_window,
           "repetitions": repetitions, "memory_bytes": memory, "modes": rows}
    if sampled:
        out["sampled"] = sampled
    return out


def rewrite_summary(gen, rewrite) -> dict:
    """What the driver's rewrite put on our ops in the main graph (it reads no weight: cheap to redo)."""
    from driver.sessions import rewrite_graph

    if not rewrite:
        return {"matmul_nbits": 0, "gated_delta_net": 0, "linear_attention_kept": 0, "group_query_attention": 0,
                "float_matmul": 0, "gated_attention": 0, "mlp": 0, "norm": 0}
    report = rewrite_graph(gen.folder.main, rewrite, gen.device)[1]
    return {"matmul_nbits": report.count, "gated_delta_net": len(report.linear_attention.rewritten),
            "linear_attention_kept": len(report.linear_attention.kept),
            "group_query_attention": len(report.attention.rewritten), "float_matmul": len(report.float_matmul.rewritten),
            "gated_attention": len(report.gated_attention.rewritten), "mlp": len(report.mlp.rewritten),
            "norm": len(report.norm.rewritten)}


def run_genai(folder: Path, prompts: list[list[int]], new_tokens: int) -> dict:
    """onnxruntime-genai 0.18 on the same folder: greedy `Generator` and `MtpGenerator` (the head as
    a separate folder, made by models.head_folder). Decode tok/s counts from after the prompt's
    forward (append_tokens) to the last token; second (warm) pass of each prompt."""
    import tempfile

    import onnxruntime_genai as og

    from models.head_folder import write_head_folder

    head_dir = Path(tempfile.mkdtemp()) / "head"
    main_model = og.Model(str(folder))
    head_model = og.Model(str(write_head_folder(folder, head_dir)))
    rows = {}
    greedy_tokens = []
    for mode, k in MODES:
        per_prompt = []
        for p, ids in enumerate(prompts):
            for _ in range(2):  # warm-up, then the measured pass
                params = og.GeneratorParams(main_model)
                params.set_search_options(max_length=len(ids) + new_tokens, do_sample=False)
                prompt = np.asarray(ids, np.int32)
                if k:
                    params.set_speculative_options(max_draft_tokens=k)
                    gen = og.MtpGenerator(main_model, head_model, params)
                    gen.append_tokens(prompt)
                else:
                    gen = og.Generator(main_model, params)
                    gen.append_tokens(prompt[None, :])
                start = time.perf_counter()
                while not gen.is_done():
                    gen.generate_next_token()
                seconds = time.perf_counter() - start
                sequence = gen.get_sequence() if k else gen.get_sequence(0)
                tokens = [int(t) for t in sequence][len(ids):]
            entry = {"tok_s": (len(tokens) - 1) / seconds, "tokens": tokens}  # the first new token: the prompt forward
            if k:
                stats = gen.get_stats()
                # Accepted / drafted, as our rows count it. onnxruntime-genai's own acceptance_rate divides by
                # the drafts it compared, which stop at a round's first mismatch (src/mtp_generator.cpp), so
                # at k >= 2 it reads higher for the same drafts; kept beside it under its own name.
                entry["acceptance"] = stats["draft_tokens_accepted"] / max(stats["draft_tokens_proposed"], 1)
                entry["genai_acceptance_rate"] = float(stats.get("acceptance_rate", 0.0))
                entry["first_difference_from_greedy"] = first_difference(tokens, greedy_tokens[p])
            else:
                greedy_tokens.append(tokens)
            per_prompt.append(entry)
            del gen
        name = mode if not k else f"mtp_k{k}"
        rows[name] = row = summarize(per_prompt, k)
        print(f"  genai {name:8s} {row['tok_s_median']:8.1f} tok/s", flush=True)
    return {"genai": og.__version__ if hasattr(og, "__version__") else "0.18", "acceptance": ACCEPTED_PER_DRAFTED,
            "modes": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp/models_qwen35_27b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--state-window", type=int, default=5, help="slots of the folder built when it is missing (k + 1 for k = 4)")
    ap.add_argument("--mtp-noise", type=float,
                    help="the head's noise for a folder built by this run (models build --mtp-noise, the acceptance "
                         "knob; default: the builder's); refused for a folder that exists")
    ap.add_argument("--out-scale", type=float,
                    help="the output projections' scale for a folder built by this run (models build --out-scale: "
                         "smaller makes the target's next token more a function of the current one, so the head "
                         "accepts more; default: the builder's); refused for a folder that exists")
    ap.add_argument("--provider", default="cuda", help="cpu: a dry run of the script on a CPU folder")
    ap.add_argument("--configurations", default="ours,ort,genai",
                    help="any of ours, ours_mm (ours with only the MatMulNBits rewrite: ORT's own linear-attention "
                         "nodes), ours_no<kind> (every rewrite but one of ops.rewrite.REWRITES, '-' dropped: "
                         "ours_nomlp, ours_nonorm, ...), tiles (ours on the folder rewritten with --pack), ort, genai")
    ap.add_argument("--skip-identity", action="store_true", help="leave out the per-op identity check")
    ap.add_argument("--repetitions", type=int, default=1, help="measured passes per prompt after the warm-up (medians)")
    ap.add_argument("--ort-repetitions", type=int, help="measured passes for the `ort` configuration (the anchor; "
                    "default --repetitions), so that a long run fits one device call")
    ap.add_argument("--phases", action="store_true", help="also one profiled pass per mode: ms per round per phase")
    ap.add_argument("--temperatures", default="",
                    help="comma list: also time sampled decoding (plain and MTP) at these temperatures, "
                         "for the first configuration in --configurations' order (ours, ours_mm, ours_no<kind>, tiles, ort)")
    args = ap.parse_args()
    out = out_dir(None)
    folder = Path(args.folder)
    report = {"command": " ".join(["bench/e2e_27b.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "revision": git_revision(),
              "folder": str(folder), "provider": args.provider, "new_tokens": args.new_tokens, "prompt_length": args.prompt_length,
              "build": ensure_folder(folder, args.state_window, args.mtp_noise, args.out_scale)}
    from driver.device import describe, make_device

    report["info"] = describe(make_device(args.provider, graph_capture=False))  # the GPU's name, ORT's version
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    rng = np.random.default_rng(0)  # token-id prompts: the tokenizer's real tokens are the low ids
    prompts = [rng.integers(0, min(vocab, 8000), args.prompt_length).tolist() for _ in range(args.prompts)]
    report["configurations"] = []
    wanted = args.configurations.split(",")
    temps = tuple(float(t) for t in args.temperatures.split(",") if t)
    without = {f"ours_no{kind.replace('-', '')}": kind for kind in REWRITES}
    for label in ("ours", "ours_mm", *without, "tiles", "ort"):
        if label not in wanted:
            continue
        where = folder
        if label == "tiles":
            where, report["tiles_folder"] = tiles_folder(folder)
        rewrite = {"ort": False, "ours_mm": ("matmul",)}.get(label, True)
        if label in without:
            rewrite = tuple(k for k in REWRITES if k != without[label])
        temperatures = () if report["configurations"] else temps
        report["configurations"].append(
            run_configuration(where, args.provider, rewrite, prompts, args.new_tokens, label, temperatures,
                              args.ort_repetitions if label == "ort" and args.ort_repetitions else args.repetitions,
                              args.phases))
        (out / "e2e_27b.json").write_text(json.dumps(report, indent=1))
    if "genai" in wanted:
        try:
            report["genai"] = run_genai(folder, prompts, args.new_tokens)
        except Exception as error:  # recorded, not fatal: the driver's numbers stand on their own
            report["genai"] = {"error": f"{type(error).__name__}: {error}"}
        ours = next((c for c in report["configurations"] if c["label"] == "ours"), None)
        if ours is not None and "modes" in report["genai"]:
            # our greedy against onnxruntime-genai's greedy on the same folder: the first token that differs
            report["genai"]["greedy_vs_ours"] = [
                first_difference(g["tokens"], o["tokens"])
                for g, o in zip(report["genai"]["modes"]["greedy"]["prompts"], ours["modes"]["greedy"]["prompts"])]
        (out / "e2e_27b.json").write_text(json.dumps(report, indent=1))
    if not args.skip_identity:
        identity = subprocess.run([sys.executable, "-m", "driver", "identity", "--model", str(folder), "--provider",
                                   args.provider, "--json"], cwd=ROOT, capture_output=True, text=True)
        try:
            report["identity"] = json.loads(identity.stdout)
        except json.JSONDecodeError:
            report["identity"] = {"rc": identity.returncode, "stderr": identity.stderr[-3000:]}
        (out / "e2e_27b.json").write_text(json.dumps(report, indent=1))
    print("configuration  mode       tok/s  acceptance  ==greedy")
    for conf in report["configurations"]:
        for name, row in conf["modes"].items():
            print(f"{conf['label']:13s}  {name:8s} {row['tok_s_median']:7.1f}  "
                  f"{row.get('acceptance_mean', float('nan')):10.3f}  {row.get('identical_to_greedy', '-')}")
    for conf in report["configurations"]:
        for temperature, modes in conf.get("sampled", {}).items():
            for name, row in modes.items():
                print(f"{conf['label'] + ' T=' + temperature:13s}  {name:8s} {row['tok_s_median']:7.1f}  "
                      f"{row.get('acceptance_mean', float('nan')):10.3f}  -")
    for name, row in report.get("genai", {}).get("modes", {}).items():
        print(f"{'genai':13s}  {name:8s} {row['tok_s_median']:7.1f}  "
              f"{row.get('acceptance_mean', float('nan')):10.3f}  {row.get('identical_to_greedy', '-')}")
    if "error" in report.get("genai", {}):
        print("genai:", report["genai"]["error"])
    if "identity" in report:
        print("identity:", json.dumps(report["identity"])[:1500])
    return 0


if __name__ == "__main__":
    sys.exit(main())
