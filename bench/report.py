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
    "e2e": ("2026-11-29-run19", "e2e_27b.json"),  # the latest end to end: ours, row-major and tiles
    "e2e_all": ("2026-11-29-run11", "e2e_27b.json"),  # the latest with ORT's kernel and onnxruntime-genai
    "gemv": ("2026-11-29-run18", "gemv.json"),  # the latest bench/gemv.py
    "profile": ("2026-11-29-run12", "kernel_profile_27b.json"),  # GPU time per kernel family
    "e2e_gdn": ("2026-12-02-sampling-cuda", "e2e_27b.json"),  # the latest: GatedDeltaNet on CUDA, and sampling
}
MODES = ("greedy", "mtp_k1", "mtp_k2", "mtp_k3")
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
    """One configuration's modes from e2e_27b.json: by label (newer runs) or by the rewrite flag (run 11)."""
    for c in e2e["configurations"]:
        if (label is not None and c.get("label") == label) or (label is None and c.get("rewrite") == rewrite):
            return c["modes"]
    raise ReportError(f"e2e_27b.json has no configuration {label or ('rewrite=' + str(rewrite))}")


def tok_s(modes: dict, mode: str) -> float:
    return modes[mode]["tok_s_median"]


def e2e_row(name: str, modes: dict) -> list[str]:
    same = " / ".join(str(modes[m].get("identical_to_greedy", "-")) for m in MODES[1:])
    return [name] + [f1(tok_s(modes, m)) for m in MODES] + [same]


def e2e_header(e2e: dict) -> list[str]:
    prompts = len(e2e["configurations"][0]["modes"]["greedy"]["prompts"])
    return ["", "greedy", "MTP k=1", "k=2", "k=3", f"MTP == greedy, k=1/2/3 (of {prompts} prompts)"]


def e2e_latest_table(run: dict) -> str:
    e2e = run["json"]
    ours, tiles = configuration(e2e, "ours"), configuration(e2e, "tiles")
    rows = [e2e_row("MatMulNBits' row-major layout", ours),
            e2e_row("the folder rewritten with `python -m ops rewrite --pack` (tiles layout)", tiles)]
    k3 = MODES[-1]
    return (f"{run_caption(run)}, `python -m driver generate` on our ops:\n\n"
            f"{table(e2e_header(e2e), rows)}\n\n"
            f"Packed, the same driver decodes {-gain(tok_s(ours, 'greedy'), tok_s(tiles, 'greedy')):.0f}% more "
            f"tokens/s greedy and {-gain(tok_s(ours, k3), tok_s(tiles, k3)):.0f}% more at k=3; MTP k=3 runs at "
            f"{tok_s(ours, k3) / tok_s(ours, 'greedy'):.2f}x greedy "
            f"({tok_s(tiles, k3) / tok_s(tiles, 'greedy'):.2f}x packed).")


def e2e_all_table(run: dict, latest: dict) -> str:
    e2e = run["json"]
    ours, ort, genai = configuration(e2e, rewrite=True), configuration(e2e, rewrite=False), e2e["genai"]["modes"]
    version = e2e["genai"]["genai"]
    rows = [e2e_row("`python -m driver generate` on our ops (row-major)", ours),
            e2e_row("the same driver on ONNX Runtime's own MatMulNBits", ort),
            e2e_row(f"onnxruntime-genai {version} `Generator` / `MtpGenerator`, same folder", genai)]
    k3 = MODES[-1]
    genai_best = max(tok_s(genai, m) for m in MODES[1:])
    genai_greedy = [p["tok_s"] for p in genai["greedy"]["prompts"]]
    return (f"{run_link(latest)} measured only our ops. The comparison with ONNX Runtime's own kernel and "
            f"with onnxruntime-genai is from the latest run that measured all of them, {run_caption(run)}: "
            f"an older GEMV and another day, so compare its rows with each other, not with the table above.\n\n"
            f"{table(e2e_header(e2e), rows)}\n\n"
            f"In that run MTP k=3 on our ops is {tok_s(ours, k3) / genai_best:.2f}x onnxruntime-genai's best "
            f"MTP setting and {tok_s(ours, k3) / tok_s(ours, 'greedy'):.2f}x our greedy. onnxruntime-genai's "
            f"figures move from prompt to prompt and run to run (its greedy: {span(genai_greedy, f1)} tok/s "
            f"over the {len(genai_greedy)} prompts).")


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
            f"({ours:.2f} of {total:.2f} ms per token), from {run_caption(run)}.")


# ---- what is not there yet -----------------------------------------------------------------------


def targets_line(run: dict) -> str:
    entries = run["json"]["targets"]
    missed = "; ".join(f"{t['target']} ({t['measured']})" for t in entries if not t["met"])
    met = "; ".join(f"{t['target']} ({t['measured']})" for t in entries if t["met"])
    return (f"- bench/gemv.py's targets, scored in {run_link(run)} on the default (row-major) path. "
            f"Missed: {missed}. Met: {met}.")


def limits(data: dict) -> str:
    gemv, e2e, e2e_all = data["gemv"]["json"], data["e2e"]["json"], data["e2e_all"]["json"]
    chain = lambda M, impl: share(gemv, "chain", M, impl)  # noqa: E731
    mid = [M for M in gemv["table"]["chain"] if 2 <= int(M) <= 8]
    wide = [M for M in gemv["table"]["chain"] if 9 <= int(M) <= 16]
    cost = lambda M, impl: us(gemv, "chain", M, impl) / us(gemv, "chain", "1", impl)  # noqa: E731
    same = [c["modes"][m].get("identical_to_greedy", 0) for c in e2e["configurations"] for m in MODES[1:]]
    prompts = len(e2e["configurations"][0]["modes"]["greedy"]["prompts"])
    origins = e2e_all["identity"]["origins"]
    la = ", ".join(f"{o['op']} by {sci(o['max_diff'])}" for o in origins)
    return "\n".join([
        "Not there yet:",
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
        gdn_line(data["e2e_gdn"], data["e2e_all"]),
    ])


def gdn_line(run: dict, before: dict) -> str:
    """Token identity on CUDA now that the linear-attention blocks run on ort_mtp::GatedDeltaNet."""
    e2e = run["json"]
    modes = configuration(e2e, "ours")
    same = [modes[m].get("identical_to_greedy", 0) for m in MODES[1:]]
    prompts = len(modes["greedy"]["prompts"])
    rows = e2e["identity"]["rows"]
    origins = before["json"]["identity"]["origins"]
    la = ", ".join(f"{o['op']} by {sci(o['max_diff'])}" for o in origins)
    firsts = sorted({p["first_difference_from_greedy"] for m in MODES[1:] for p in modes[m]["prompts"]
                     if p.get("first_difference_from_greedy") is not None})
    where = f" (the others first differed at token index {', '.join(map(str, firsts))}, counting the {e2e['new_tokens']} new tokens from 0)" if firsts else ""
    return (f"- Token identity on CUDA is measured, not yet guaranteed: with the linear-attention blocks on "
            f"`ort_mtp::GatedDeltaNet` (now the default; before, ONNX Runtime's "
            f"LinearAttention rows differed at width {before['json']['identity']['rows']['width']}: {la}) "
            f"MTP printed greedy's tokens on {sum(same)} of {len(same) * prompts} (k, prompt) streams{where} in "
            f"{run_caption(run)}, whose width-{rows['width']} identity check found every logits row "
            f"bit-identical and no differing op; greedy {f1(tok_s(modes, 'greedy'))} tok/s, MTP k=3 "
            f"{f1(tok_s(modes, MODES[-1]))}. GroupQueryAttention and the fp16 a/b projections (cuBLAS) are "
            f"not row-consistent by construction yet ([docs/driver.md](docs/driver.md#token-identity)).")


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
    info = data["gemv"]["json"]["info"]
    e2e = data["e2e"]["json"]
    prompts = len(e2e["configurations"][0]["modes"]["greedy"]["prompts"])
    parts = [
        f"One {info['gpu']}, ONNX Runtime {info['onnxruntime']}. End to end: the 27B-class synthetic model "
        f"(`python -m models build --preset qwen35-27b --ep cuda --state-window 4`), {prompts} prompts of "
        f"{e2e['prompt_length']} token ids, {e2e['new_tokens']} new tokens, median decode tok/s "
        f"(`bench/e2e_27b.py`).",
        e2e_latest_table(data["e2e"]),
        e2e_all_table(data["e2e_all"], data["e2e"]),
        gemv_table(data["gemv"]),
        profile_line(data["profile"]),
        sampling_line(data["e2e_gdn"]),
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
