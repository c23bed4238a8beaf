"""README.md's measured numbers, rendered from the committed result JSON under bench/results/.

    python bench/report.py           # rewrite the generated parts of README.md in place
    python bench/report.py --check   # exit 1 with a short diff when README.md differs, 0 when it matches

The generated parts sit between marker comments in README.md:
`<!-- report:NAME ... -->` and `<!-- /report:NAME -->`, NAME one of SECTIONS below (the measured
section, and the opening's two ratios: ORT's M=2 / M=1 and ours M=8 / M=1). Every number in them comes from a JSON file
of one run folder; each table names its run (a link to the folder's README) and the code revision
and GEMV version that the folder's README gives on its `Code: revision <rev> (GEMV version <v>...`
line. Standard library only; no GPU.

After a new run replaces one of RUNS, point RUNS at its folder and run `python bench/report.py`.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "bench" / "results"

# role -> (run folder under bench/results, JSON file in it)
RUNS = {
    "e2e": ("2026-12-05-mlp-cuda", "b/e2e_27b.json"),  # the latest end to end: ours, ORT's ops, onnxruntime-genai
    "phases": ("2026-12-05-mlp-cuda", "b/e2e_27b.json"),  # the latest with --phases
    "identity": ("2026-12-05-mlp-cuda", "a/e2e_ab.json"),  # the latest with the width-k+1 identity check
    "gemv": ("2026-11-29-run18", "gemv.json"),  # the latest bench/gemv.py
    "profile": ("2026-12-05-mlp-cuda", "c/profile.json"),  # GPU time per kernel family (bench/kernel_profile_27b.py)
    "sampling": ("2026-12-02-sampling-cuda", "e2e_27b.json"),  # the latest sampled decoding
    # the latest side by side on a folder whose synthetic head accepts like a trained one (--out-scale)
    "trained": ("2026-12-05-trained-acceptance", "side_h200/e2e_27b.json"),
}
MODES = ("greedy", "mtp_k1", "mtp_k2", "mtp_k3")  # the sampled run's modes (k = 3 its last)
TABLE_MS = ("1", "2", "4", "8", "16")
LAYER_SHAPES = ("q_proj", "o_proj", "in_proj_qkv", "in_proj_z", "gate_up", "down")  # k_proj: below


class ReportError(RuntimeError):
    """Missing data or markers, reported as one line."""


def run_meta(folder: str) -> dict:
    """The revision and GEMV version from the folder README's `Code: revision ...` paragraph."""
    text = (RESULTS / folder / "README.md").read_text()
    m = re.search(r"^Code: revision ([0-9a-f]{7,40})\b(.*?)(?:\n\n|\Z)", text, re.M | re.S)
    if not m:
        raise ReportError(f"bench/results/{folder}/README.md has no 'Code: revision <rev>' line")
    version = re.search(r"GEMV version ([0-9.]*[0-9])", m.group(2))
    return {"folder": folder, "revision": m.group(1), "gemv_version": version.group(1) if version else None}


DEFAULT_MODEL = RESULTS / "cpu" / "default_model.json"  # bench/default_model.py: the README's quick-start table


def load() -> dict:
    """role -> {"folder", "revision", "gemv_version", "json"} for every role in RUNS, and
    "default_model" -> bench/default_model.py's JSON."""
    data = {}
    if not DEFAULT_MODEL.is_file():
        raise ReportError(f"{DEFAULT_MODEL.relative_to(ROOT)} not found")
    data["default_model"] = {"json": json.loads(DEFAULT_MODEL.read_text())}
    for role, (folder, name) in RUNS.items():
        path = RESULTS / folder / name
        if not path.is_file():
            raise ReportError(f"bench/results/{folder}/{name} not found")
        data[role] = {**run_meta(folder), "json": json.loads(path.read_text())}
    return data


# ---- formatting ----------------------------------------------------------------------------------


def f1(x: float) -> str:
    return f"{x:.1f}"


def pct(x: float) -> str:
    return f"{x:.0f}%"


def span(values, fmt=lambda v: f"{v:.0f}") -> str:
    """'lo-hi' (or one value when they round the same) of values, each formatted by fmt."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def sci(x: float) -> str:
    """3.8e-6, not 3.8e-06."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def ms_text(ms: list[str]) -> str:
    """'M = 2..8' for more than three measured M, else 'M = 8, 12 and 16'."""
    return f"M = {ms[0]}..{ms[-1]}" if len(ms) > 3 else "M = " + " and ".join([", ".join(ms[:-1]), ms[-1]])


def gain(before: float, after: float) -> float:
    """Percent less time (or more throughput, with the arguments swapped) of after against before."""
    return 100.0 * (1.0 - after / before)


def run_link(run: dict) -> str:
    folder = run["folder"]
    name = f"run {folder.rsplit('-run', 1)[-1]}" if "-run" in folder else folder
    return f"[{name}](bench/results/{folder}/README.md)"


def run_caption(run: dict) -> str:
    version = f", GEMV version {run['gemv_version']}" if run["gemv_version"] else ""
    return f"{run_link(run)} (revision {run['revision']}{version})"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---- end to end ----------------------------------------------------------------------------------


def configuration(e2e: dict, label: str | None = None, rewrite: bool | None = None) -> dict:
    """One configuration's modes from e2e_27b.json, by its label (or, for runs before labels, the rewrite flag)."""
    for c in e2e["configurations"]:
        if (label is not None and c.get("label") == label) or (label is None and c.get("rewrite") == rewrite):
            return c["modes"]
    raise ReportError(f"e2e_27b.json has no configuration {label or ('rewrite=' + str(rewrite))}")


def memory_sentence(e2e: dict) -> str:
    """What our two Generators hold on the device, where the run measured it (bench/e2e_27b.py's
    memory_bytes, since b8aeef1; earlier runs reported one peak over both, which no user run holds)."""
    ours = next((c for c in e2e["configurations"] if c.get("label") == "ours"), {})
    memory = ours.get("memory_bytes") or {}
    if memory.get("mtp_generator") is None or memory.get("greedy_generator") is None:
        return ""
    return (f" Device memory our Generators add (loaded, CUDA graphs captured): MTP "
            f"{memory['mtp_generator'] / 1e9:.1f} GB, greedy {memory['greedy_generator'] / 1e9:.1f} GB.")


def tok_s(modes: dict, mode: str) -> float:
    return modes[mode]["tok_s_median"]


def e2e_ks(modes: dict) -> list[str]:
    return [m for m in modes if m.startswith("mtp_k")]


def e2e_row(name: str, modes: dict, ks: list[str], mark: str = "") -> list[str]:
    same = " / ".join(str(modes[m].get("identical_to_greedy", "-")) for m in ks)
    accept = " / ".join(f"{modes[m]['acceptance_mean']:.2f}" for m in ks) + mark
    return [name] + [f1(tok_s(modes, m)) for m in ["greedy", *ks]] + [accept, same]


# A run's onnxruntime-genai acceptances before bench/e2e_27b.py counted them as accepted / drafted (the JSON's
# genai section then says "acceptance") are its own acceptance_rate: accepted / drafts compared, where the
# drafts after a round's first mismatch are not counted, so at k >= 2 they read higher for the same drafts.
ACCEPTED_PER_DRAFTED = "accepted / drafted"  # the genai section's "acceptance" where it counts as ours (e2e_27b.py)
GENAI_RATE_NOTE = ("\\* onnxruntime-genai's own `acceptance_rate`: accepted / drafts compared, which stop at a "
                   "round's first mismatch (the rows above: accepted / drafted), so at k >= 2 it reads higher for "
                   "drafts of the same quality.")


def e2e_table(run: dict, head: str) -> str:
    """The side by side: the driver's defaults, the driver on ORT's own ops (where the run has them),
    onnxruntime-genai; `head` says what the acceptances are."""
    e2e = run["json"]
    ours, genai = configuration(e2e, "ours"), e2e["genai"]["modes"]
    ort = configuration(e2e, "ort") if any(c.get("label") == "ort" for c in e2e["configurations"]) else None
    ks = e2e_ks(ours)
    prompts = len(ours["greedy"]["prompts"])
    nums = "/".join(k[len("mtp_k"):] for k in ks)
    header = ["", "greedy"] + [f"MTP k={k[len('mtp_k'):]}" for k in ks] + [f"acceptance, k={nums}",
                                                                              f"MTP == greedy, k={nums} (of {prompts})"]
    version = e2e["genai"]["genai"]
    rows = [e2e_row("`python -m driver generate` (the defaults: our ops, tiles layout)", ours, ks)]
    if ort is not None:
        rows.append(e2e_row("the same driver on ONNX Runtime's own ops (`--no-rewrite`)", ort, ks))
    rows.append(e2e_row(f"onnxruntime-genai {version} `Generator` / `MtpGenerator`, same folder", genai, ks,
                        "" if e2e["genai"].get("acceptance") == ACCEPTED_PER_DRAFTED else " \\*"))
    best = max(ks, key=lambda m: tok_s(ours, m))
    genai_best = max(ks, key=lambda m: tok_s(genai, m))
    differ = [d for d in e2e["genai"].get("greedy_vs_ours", []) if d is not None]
    vs = (f"onnxruntime-genai's greedy printed our greedy's tokens on {prompts - len(differ)} of {prompts} prompts"
          + (f" ({'the others' if len(differ) < prompts else 'they'} first differed at new token "
             f"{', '.join(map(str, differ))}: its kernels round differently)"
             if differ else ""))
    return (f"{run_caption(run)}, median decode tok/s, {prompts} prompts:\n\n{table(header, rows)}\n\n"
            f"Our greedy is {tok_s(ours, 'greedy') / tok_s(genai, 'greedy'):.2f}x onnxruntime-genai's greedy; our "
            f"best MTP (k={best[len('mtp_k'):]}) is {tok_s(ours, best) / tok_s(ours, 'greedy'):.2f}x our greedy and "
            f"{tok_s(ours, best) / tok_s(genai, genai_best):.2f}x onnxruntime-genai's best MtpGenerator "
            f"(k={genai_best[len('mtp_k'):]}); {vs}. {head}{memory_sentence(e2e)}"
            + ("" if e2e["genai"].get("acceptance") == ACCEPTED_PER_DRAFTED else f"\n\n{GENAI_RATE_NOTE}"))


def synthetic_head(run: dict, trained: dict) -> str:
    """What the default folder's acceptances are, beside the trained default model's (`trained`:
    default_model.json's modes)."""
    ks = e2e_ks(configuration(run["json"], "ours"))
    return (f"The acceptances are the synthetic head's, set by its construction (`--mtp-noise`), not a trained "
            f"model's: the trained default model's head accepts {trained_acceptance(trained, ks)} at k = "
            f"{', '.join(k[len('mtp_k'):] for k in ks)} on held-out text (its table above).")


def trained_like(run: dict, trained: dict) -> str:
    """The side by side on a folder built to accept like a trained head, with its machine and knobs."""
    e2e = run["json"]
    build, info = e2e["build"], e2e["info"]
    ks = e2e_ks(configuration(e2e, "ours"))
    head = (f"The folder's synthetic head was built to accept about as a trained one does (`--mtp-noise "
            f"{build['mtp_noise']:g} --out-scale {build['out_scale']:g}`: a smaller output projection makes the "
            f"target's next token more a function of the current one); the trained default model's head accepts "
            f"{trained_acceptance(trained, ks)}. Same shapes and kernels as above: only the acceptance differs.")
    return (f"The same side by side at a trained head's acceptance, one {info['gpu']}, {e2e['new_tokens']} new "
            f"tokens: " + e2e_table(run, head))


def trained_acceptance(modes: dict, ks: list[str]) -> str:
    """'0.85 / 0.77 / ...' at the given MTP modes, from default_model.json's modes."""
    return " / ".join(f"{modes[k]['acceptance_mean']:.2f}" for k in ks if k in modes)


def phases_table(run: dict) -> str:
    """ms per MTP round per phase, one profiled pass per k (every phase closed by a device sync)."""
    ours = configuration(run["json"], "ours")
    ks = e2e_ks(ours)
    names = list(ours[ks[0]]["phase_ms_per_round"])
    rows = [[f"k={k[len('mtp_k'):]}"] + [f"{ours[k]['phase_ms_per_round'][n]:.2f}" for n in names] for k in ks]
    step = 1000.0 / tok_s(ours, "greedy")
    return (f"Where an MTP round's time goes on the defaults ({run_caption(run)}, `--phases`: one profiled pass, "
            f"each phase closed by a device synchronisation), ms per round, against {step:.2f} ms per greedy "
            f"token in the same run:\n\n{table([''] + names, rows)}")


# ---- the int4 matmul alone -----------------------------------------------------------------------


def us(gemv: dict, workload: str, M: str, impl: str) -> float:
    return gemv["table"][workload][M][impl]["us"]


def share(gemv: dict, workload: str, M: str, impl: str) -> float:
    return gemv["table"][workload][M][impl]["pct_of_copy_ceiling"]


def chain_shape(gemv: dict) -> str:
    """'4 x (5120->17408, 17408->5120)' from the chain workload's nodes."""
    nodes = next(w["nodes"] for w in gemv["workloads"] if w["name"] == "chain")
    pair = nodes[:2]
    if nodes != pair * (len(nodes) // 2):
        raise ReportError(f"gemv.json's chain is not a repeated pair of layers: {nodes}")
    return f"{len(nodes) // 2} x ({pair[0][0]}->{pair[0][1]}, {pair[1][0]}->{pair[1][1]})"


def lm_head_shape(gemv: dict) -> str:
    [(k, n)] = next(w["nodes"] for w in gemv["workloads"] if w["name"] == "lm_head")
    return f"{k} x {n}"


def gemv_table(run: dict) -> str:
    gemv = run["json"]
    names = {"ours": "ours", "ours_tiles": "ours, tiles layout (`--pack`)",
             "ort": "ONNX Runtime default", "ort_fpa_intb": "ONNX Runtime fpA_intB"}
    rows = []
    for workload in ("chain", "lm_head"):
        for impl in ("ours", "ours_tiles", "ort", "ort_fpa_intb"):
            cells = [f1(us(gemv, workload, M, impl)) for M in TABLE_MS]
            if impl.startswith("ours"):
                cells[0] += f" ({pct(share(gemv, workload, '1', impl))})"
            rows.append([f"{workload}, {names[impl]}"] + cells)
    return (f"The int4 matmul alone, {run_caption(run)}, `bench/gemv.py`: the chain of "
            f"{chain_shape(gemv)} layers and the {lm_head_shape(gemv)} lm_head, in us under ONNX Runtime's "
            f"CUDA graph (in brackets: the share of the copy ceiling, {gemv['copy_ceiling_GBps']:.0f} GB/s "
            f"read + write, measured in the same run):\n\n"
            f"{table(['M'] + list(TABLE_MS), rows)}\n\n{tiles_gain(gemv)}")


def tiles_gain(gemv: dict) -> str:
    """How much less time the tiles layout takes than the row-major one, from the same run."""
    def g(workload, M):
        return gain(us(gemv, workload, M, "ours"), us(gemv, workload, M, "ours_tiles"))

    wide = [M for M in gemv["table"]["lm_head"] if int(M) >= 8]
    return (f"The tiles layout takes {g('chain', '1'):.0f}% less time than the row-major one on the chain "
            f"at M=1 ({g('chain', '8'):.0f}% at M=8), {span([g(s, '1') for s in LAYER_SHAPES])}% less per "
            f"layer-sized matrix at M=1 and {span([g(s, '8') for s in LAYER_SHAPES])}% at M=8 (k_proj, "
            f"latency-bound: {g('k_proj', '1'):.0f}% at M=1, {g('k_proj', '8'):.0f}% at M=8), and "
            f"{span([g('lm_head', M) for M in wide])}% less on the lm_head at {ms_text(wide)}.")


def m8_ratio(data: dict) -> str:
    """The opening table's claim: what M=8 costs against M=1 on the chain, both layouts."""
    gemv = data["gemv"]["json"]
    r = {impl: us(gemv, "chain", "8", impl) / us(gemv, "chain", "1", impl) for impl in ("ours", "ours_tiles")}
    return (f"{r['ours']:.2f}x at M = 8 what it costs at M = 1, {r['ours_tiles']:.2f}x in the tiles layout "
            f"([measured](#measured-so-far))")


def ort_m2(data: dict) -> str:
    """The opening's claim: what ONNX Runtime's own int4 MatMulNBits costs at M=2 against M=1."""
    gemv = data["gemv"]["json"]
    return f"{us(gemv, 'chain', '2', 'ort') / us(gemv, 'chain', '1', 'ort'):.1f}x as much at M=2 as at M=1"


def profile_line(run: dict) -> str:
    greedy = next(r for r in run["json"]["runs"] if r["mode"] == "greedy")
    ours, total = greedy["families_ms_per_token"]["int4 matmul (ours)"], greedy["gpu_kernel_ms_per_token"]
    return (f"In a greedy decode step our int4 matmul takes {100 * ours / total:.0f}% of the GPU kernel time "
            f"({ours:.2f} of {total:.2f} ms per token, eager; under programmatic dependent launch a kernel's "
            f"time starts before the previous one ends, so the shares overlap), from {run_caption(run)}.")


# ---- what is not there yet -----------------------------------------------------------------------


def targets_line(run: dict) -> str:
    entries = run["json"]["targets"]
    missed = "; ".join(f"{t['target']} ({t['measured']})" for t in entries if not t["met"])
    met = "; ".join(f"{t['target']} ({t['measured']})" for t in entries if t["met"])
    return (f"- bench/gemv.py's targets, scored in {run_link(run)} on the default (row-major) path. "
            f"Missed: {missed}. Met: {met}.")


def e2e_targets(run: dict) -> str:
    """The end-to-end targets on the 27B-class folder, scored on one side-by-side run."""
    e2e = run["json"]
    ours, genai = configuration(e2e, "ours"), e2e["genai"]["modes"]
    ks = e2e_ks(ours)
    greedy = tok_s(ours, "greedy")
    best = max(ks, key=lambda m: tok_s(ours, m))
    genai_best = max(tok_s(genai, m) for m in ks)
    return (f"greedy at least 150 tok/s ({f1(greedy)}) and 1.8x onnxruntime-genai's "
            f"({greedy / tok_s(genai, 'greedy'):.2f}x); the best MTP at least 300 tok/s ({f1(tok_s(ours, best))}), "
            f"2x our greedy ({tok_s(ours, best) / greedy:.2f}x) and 2x onnxruntime-genai's best MtpGenerator "
            f"({tok_s(ours, best) / genai_best:.2f}x), at acceptance {ours[best]['acceptance_mean']:.2f} "
            f"(k={best[len('mtp_k'):]})")


def e2e_targets_line(run: dict, trained: dict) -> str:
    """The targets at the default synthetic head's acceptance and at a trained-like one."""
    return (f"- The end-to-end targets, scored in {run_link(run)} on the default synthetic head: "
            f"{e2e_targets(run)}. At a trained-like acceptance ({run_link(trained)}, "
            f"{trained['json']['info']['gpu']}): {e2e_targets(trained)}.")


def limits(data: dict) -> str:
    gemv = data["gemv"]["json"]
    chain = lambda M, impl: share(gemv, "chain", M, impl)  # noqa: E731
    mid = [M for M in gemv["table"]["chain"] if 2 <= int(M) <= 8]
    wide = [M for M in gemv["table"]["chain"] if 9 <= int(M) <= 16]
    cost = lambda M, impl: us(gemv, "chain", M, impl) / us(gemv, "chain", "1", impl)  # noqa: E731
    return "\n".join([
        "Not there yet:",
        e2e_targets_line(data["e2e"], data["trained"]),
        targets_line(data["gemv"]),
        f"- At M=1 the GEMV streams a layer-sized matrix's weights at "
        f"{span([share(gemv, s, '1', 'ours') for s in LAYER_SHAPES])}% of the copy ceiling "
        f"({span([share(gemv, s, '1', 'ours_tiles') for s in LAYER_SHAPES])}% in the tiles layout; k_proj's "
        f"small matrices {pct(share(gemv, 'k_proj', '1', 'ours'))}), the chain at {pct(chain('1', 'ours'))} "
        f"({pct(chain('1', 'ours_tiles'))}), and at {ms_text(mid)} the chain at "
        f"{span([chain(M, 'ours') for M in mid])}% ({span([chain(M, 'ours_tiles') for M in mid])}% tiles). "
        f"M=8 costs {cost('8', 'ours'):.2f}x M=1 ({cost('8', 'ours_tiles'):.2f}x tiles): M=1 takes its "
        f"activations through the weights' ring, M = 2..8 cannot (they do not fit beside the warps' rings), "
        f"and every way tried of feeding them earlier cost at least what it saved "
        f"([docs/kernels.md](docs/kernels.md#multi-token-kernels), from the lab runs in "
        f"[lab/NOTES.md](lab/NOTES.md)).",
        f"- {ms_text(wide)} cost {span([cost(M, 'ours') for M in wide], f1)}x M = 1 on the chain "
        f"({span([cost(M, 'ours_tiles') for M in wide], f1)}x tiles): the 16-token kernels need more registers "
        f"than the cut plans for, so they run in more than one wave "
        f"([docs/kernels.md](docs/kernels.md#multi-token-kernels)).",
        identity_line(data["e2e"], data["identity"]),
    ])


def identity_line(e2e_run: dict, identity_run: dict) -> str:
    """Token identity on CUDA: our defaults against the driver on ORT's own ops, same run."""
    e2e = e2e_run["json"]

    def same(label: str) -> tuple[int, int]:
        modes = configuration(e2e, label)
        ks = e2e_ks(modes)
        return sum(modes[m].get("identical_to_greedy", 0) for m in ks), len(ks) * len(modes["greedy"]["prompts"])

    (ours, n), (ort, _) = same("ours"), same("ort")
    rows = identity_run["json"]["identity"]
    origins = ", ".join(o["op"] for o in rows["origins"]) or "no op"
    return (f"- Token identity on CUDA: on the defaults MTP printed greedy's tokens on {ours} of {n} (k, prompt) "
            f"streams of {e2e['new_tokens']} new tokens in {run_link(e2e_run)}; on ONNX Runtime's own ops "
            f"{ort} of {n}. The width-{rows['rows']['width']} identity check of {run_link(identity_run)} found "
            f"every logits row bit-identical and {origins} differing."
            + (" The acceptance test asks for 256 tokens per stream." if e2e["new_tokens"] < 256 else "")
            + " The ONNX Runtime nodes left in the forward (norms, elementwise, rotary) work row by "
            f"row ([docs/driver.md](docs/driver.md#token-identity)).")


def sampling_line(run: dict) -> str:
    """Sampled decoding on the GPU: MTP speculative sampling against plain sampling, per temperature."""
    conf = next(c for c in run["json"]["configurations"] if c.get("sampled"))
    parts = []
    for temperature, modes in conf["sampled"].items():
        plain, mtp = tok_s(modes, "sample"), tok_s(modes, MODES[-1])
        parts.append(f"T = {temperature}: plain sampling {f1(plain)} tok/s, MTP k=3 {f1(mtp)} ({mtp / plain:.2f}x, "
                     f"acceptance {modes[MODES[-1]]['acceptance_mean']:.2f})")
    return (f"Sampled decoding (speculative sampling keeps the target's distribution: "
            f"[docs/driver.md](docs/driver.md#sampling)), same folder and prompts, one seed per prompt, "
            f"from {run_caption(run)}: {'; '.join(parts)}. The synthetic head is predictive by construction, "
            f"so these acceptances are the path's, not a trained model's.")


# ---- the document ----------------------------------------------------------------------------------


def measured(data: dict) -> str:
    e2e = data["e2e"]["json"]
    # The machine of the end-to-end run where its JSON says (bench/e2e_27b.py's `info`); the runs that did
    # not record it shared their lease's GPU with the GEMV run, which did.
    info = e2e.get("info") if e2e.get("info", {}).get("gpu") else data["gemv"]["json"]["info"]
    prompts = len(e2e["configurations"][0]["modes"]["greedy"]["prompts"])
    # A run on a folder that an earlier call built recorded no window before bench/e2e_27b.py read it
    # from the folder; the identity run of the same lease built that folder and recorded it.
    window = e2e["build"].get("state_window") or data["identity"]["json"]["build"].get("state_window", 4)
    parts = [
        f"One {info['gpu']}, ONNX Runtime {info['onnxruntime']}. End to end: the 27B-class synthetic model "
        f"(`python -m models build --preset qwen35-27b --ep cuda --state-window {window}`), {prompts} prompts of "
        f"{e2e['prompt_length']} token ids, {e2e['new_tokens']} new tokens, median decode tok/s "
        f"(`bench/e2e_27b.py`).",
        e2e_table(data["e2e"], synthetic_head(data["e2e"], data["default_model"]["json"]["modes"])),
        trained_like(data["trained"], data["default_model"]["json"]["modes"]),
        phases_table(data["phases"]),
        gemv_table(data["gemv"]),
        profile_line(data["profile"]),
        sampling_line(data["sampling"]),
        limits(data),
    ]
    return "\n" + "\n\n".join(wrap(p) for p in parts) + "\n"


ATOMS = re.compile(r"`[^`]*`|\[[^\]]*\]")  # code spans and link texts: never broken across lines


def wrap(block: str, width: int = 100) -> str:
    """Prose lines wrapped at width (bullets indented under their text); table rows as they are."""
    out = []
    for line in block.split("\n"):
        if line.startswith("|") or len(line) <= width:
            out.append(line)
            continue
        glued = ATOMS.sub(lambda m: m.group(0).replace(" ", "\0"), line)
        indent = "  " if line.startswith("- ") else ""
        filled = textwrap.fill(glued, width, subsequent_indent=indent, break_long_words=False,
                               break_on_hyphens=False)
        out.append(filled.replace("\0", " "))
    return "\n".join(out)


def default_model_table(data: dict) -> str:
    """The trained default model on held-out files (bench/default_model.py)."""
    modes = data["default_model"]["json"]["modes"]
    ks = [name for name in modes if name != "greedy"]
    rows = [["acceptance (accepted / drafted)", "-"] + [f"{modes[k]['acceptance_mean']:.2f}" for k in ks],
            ["tokens per round", "1"] + [f"{modes[k]['tokens_per_round_mean']:.2f}" for k in ks],
            ["MTP == greedy (prompts)", "-"] + [f"{modes[k]['same_as_greedy']}/{modes[k]['prompts']}" for k in ks],
            ["tok/s, CPU (median over prompts)"] + [f"{modes[m]['tok_s_median']:.0f}" for m in ["greedy", *ks]]]
    header = ["", "greedy"] + [f"MTP k={k[len('mtp_k'):]}" if i == 0 else f"k={k[len('mtp_k'):]}" for i, k in enumerate(ks)]
    return "\n" + table(header, rows) + "\n"


SECTIONS = {"measured": measured, "m8": m8_ratio, "ort_m2": ort_m2, "default_model": default_model_table}
MARKER = re.compile(r"(<!-- report:(\w+)[^>]*-->)(.*?)(<!-- /report:\2 -->)", re.S)


def render(text: str, data: dict) -> str:
    """text with every generated part replaced by what data gives."""
    found = set()

    def replace(m: re.Match) -> str:
        name = m.group(2)
        if name not in SECTIONS:
            raise ReportError(f"unknown report marker {name!r}")
        found.add(name)
        return m.group(1) + SECTIONS[name](data) + m.group(4)

    out = MARKER.sub(replace, text)
    missing = set(SECTIONS) - found
    if missing:
        raise ReportError(f"README.md lacks the marker(s) {', '.join(sorted(missing))}")
    return out


def diff(current: str, wanted: str, limit: int = 40) -> str:
    lines = list(difflib.unified_diff(current.splitlines(), wanted.splitlines(), "README.md",
                                      "README.md from bench/results", lineterm="", n=0))
    more = f"\n... {len(lines) - limit} more diff lines" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


def check(readme: Path | None = None, data: dict | None = None) -> tuple[bool, str]:
    """(matches, diff) of readme (default README.md) against what the JSON gives."""
    current = (readme or README).read_text()
    wanted = render(current, load() if data is None else data)
    return current == wanted, diff(current, wanted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md differs from the JSON")
    args = ap.parse_args(argv)
    try:
        if args.check:
            ok, text = check()
            if not ok:
                print(text)
                print("README.md's measured numbers differ from bench/results: run python bench/report.py",
                      file=sys.stderr)
            return 0 if ok else 1
        current = README.read_text()
        wanted = render(current, load())
        if wanted != current:
            README.write_text(wanted)
        print("README.md " + ("rewritten" if wanted != current else "already matches bench/results"))
        return 0
    except KeyError as e:
        print(f"error: a result JSON lacks the key {e}", file=sys.stderr)
        return 2
    except (ReportError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
