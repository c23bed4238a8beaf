"""ort_mtp::GatedDeltaNet against ONNX Runtime's own com.microsoft subgraph (ops.gated_delta_net.
ort_subgraph_model: Transpose, CausalConvWithState, Split, LpNormalization, LinearAttentionGate,
LinearAttention, GatedRMSNorm) on the CUDA EP, one 27B-class linear-attention layer (Hk=16, Hv=48,
dk=dv=128, K=4, float16, state_window 4, batch 1), at widths S = 1..8.

    python bench/gated_delta_net.py [--out DIR] [--reps 15] [--calls 50]
    python bench/gated_delta_net.py --cpu-dry-run     # tiny shapes on the CPU EP: tests the script

Each implementation runs as its own session on the driver's CUDA device (CuPy buffers, one stream
shared with ORT), under ORT's CUDA graph (one graph id per width; without it, saying so, if capture is
refused), with every input and output bound by IOBinding: ours with separate present buffers (as ORT's)
and ours with the state bound in place (the driver's decode step). A measurement is the median over
--reps samples of --calls back-to-back runs, each sample timed with CUDA events on the shared stream,
a busy kernel queued ahead of it so the GPU starts only once the host has queued the sample's calls:
the device's time per run. Before timing, each implementation's y for the same inputs is kept and
the JSON gives ours against ORT's (max |difference| over max |ORT|; ORT's wide call keeps its state
unrounded between tokens, so they differ by float16 roundings).

Writes gated_delta_net.json to --out, else $OUT, else bench/results.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ops.gated_delta_net as gdn  # noqa: E402
from driver.device import bind, describe, make_device, make_session  # noqa: E402
from gpu_timing import graph_or_eager, op_bench_args, out_dir, run_impls, time_bound_run  # noqa: E402
from ops.gated_delta_net import GdnConfig  # noqa: E402

WIDTHS = list(range(1, 9))
IMPLS = ("ours", "ours, state in place", "ort")


def config(dry: bool) -> GdnConfig:
    if dry:  # ORT's CPU kernels take no state window
        return GdnConfig(2, 4, 16, 16, dtype="float16", epsilon=1e-6)
    return GdnConfig(16, 48, 128, 128, state_window=4, dtype="float16", epsilon=1e-6)


def run_impl(device, impl: str, cfg: GdnConfig, w: gdn.GdnWeights, seed: int, reps: int, calls: int) -> dict:
    xp = device.xp
    model = gdn.ort_subgraph_model(cfg, w) if impl == "ort" else gdn.gated_delta_net_model(cfg, w)
    in_place = impl == "ours, state in place"

    def measure(graph: bool) -> dict:
        session = make_session(device, model, graph_capture=graph)
        widths = {}
        for S in WIDTHS:
            x = gdn.random_inputs(np.random.default_rng(seed + S), cfg, 1, S)
            bufs = {name: xp.asarray(v.astype(np.float16)) for name, v in x.items()}
            outs = {"y": xp.full((1, S, cfg.value_dim), np.nan, dtype=np.float16)}
            if in_place:
                outs["present_conv"], outs["present_recurrent"] = bufs["past_conv"], bufs["past_recurrent"]
            else:
                outs["present_conv"] = xp.empty_like(bufs["past_conv"])
                outs["present_recurrent"] = xp.empty_like(bufs["past_recurrent"])
            binding = session.io_binding()
            for name, buf in bufs.items():
                bind(binding, device, name, buf, buf.shape)
            for name, buf in outs.items():
                bind(binding, device, name, buf, buf.shape, output=True)
            options = device.run_options(S if graph else None)
            # y as the first run leaves it, from the inputs as given
            timing, y = time_bound_run(device, session, binding, options, calls, reps,
                                       lambda y=outs["y"]: device.to_host(y).astype(np.float64))
            widths[str(S)] = {**timing, "y": y}
            del binding, bufs, outs
        del session
        return {"widths": widths}

    return graph_or_eager(device, measure)


def main(argv=None) -> int:
    args = op_bench_args(__doc__.split("\n\n")[0], argv, reps=15, calls=50)
    dry = args.cpu_dry_run
    device = make_device("cpu" if dry else "cuda", graph_capture=False)
    cfg = config(dry)
    w = gdn.random_weights(np.random.default_rng(args.seed), cfg)
    report = {"script": "bench/gated_delta_net.py", "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "info": describe(device), "config": asdict(cfg), "batch": 1, "reps": args.reps, "calls": args.calls,
              "columns_per_block": os.environ.get("ORT_MTP_GDN_COLS") or "the library's default"}
    report["impls"], report["errors"] = run_impls(
        device, IMPLS, lambda impl: run_impl(device, impl, cfg, w, args.seed, args.reps, args.calls))
    table = {}
    impls = report["impls"]
    for S in map(str, WIDTHS):
        row = {impl: impls[impl]["widths"][S]["us"] for impl in impls if S in impls[impl]["widths"]}
        if "ours" in impls and "ort" in impls and S in impls["ours"]["widths"] and S in impls["ort"]["widths"]:
            ours_y, ort_y = impls["ours"]["widths"][S]["y"], impls["ort"]["widths"][S]["y"]
            row["ort_over_ours"] = row["ort"] / row["ours"]
            row["y_max_diff_over_max_ort"] = float(np.abs(ours_y - ort_y).max() / max(np.abs(ort_y).max(), 1e-30))
        table[S] = row
    for impl in impls.values():
        for entry in impl["widths"].values():
            entry.pop("y", None)
    report["table_us"] = table
    path = out_dir(args.out) / "gated_delta_net.json"
    path.write_text(json.dumps(report, indent=1))
    names = [i for i in IMPLS if i in impls]
    print("S  " + "  ".join(f"{n:>22s}" for n in names) + "   ORT/ours   y diff vs ORT")
    for S, row in table.items():
        print(f"{S:2s} " + "  ".join(f"{row.get(n, float('nan')):20.2f}us" for n in names)
              + f"   {row.get('ort_over_ours', float('nan')):8.2f}   {row.get('y_max_diff_over_max_ort', float('nan')):.2e}")
    for e in report["errors"]:
        print(f"error in {e['impl']}: {e['error']}")
    print(f"wrote {path}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
