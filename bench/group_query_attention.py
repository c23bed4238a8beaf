"""ort_mtp::GroupQueryAttention against ONNX Runtime's com.microsoft::GroupQueryAttention on the CUDA EP,
one 27B-class full-attention layer (24 query heads, 4 kv heads, head size 256, float16, batch 1), the
cache in one shared buffer of 4,096 positions bound as both past and present (the driver's layout):

  decode / verify widths S = 1..8 and 16 after 2,048 cached positions (the rows MTP needs width-consistent);
  a prefill of 2,048 tokens into an empty cache (issue 17's target: at most 1.2x ORT's time).

    python bench/group_query_attention.py [--out DIR] [--reps 11] [--calls 30]
    python bench/group_query_attention.py --cpu-dry-run     # tiny shapes on the CPU EP: tests the script

Each implementation is its own one-node session on the driver's CUDA device (CuPy buffers on the
stream ORT shares), under ORT's CUDA graph (one graph id per case; without it, saying so, if capture is
refused), every input and output bound by IOBinding. A measurement is the median over --reps samples
of --calls back-to-back runs, each timed with CUDA events on the shared stream behind a busy kernel (so
the GPU starts once the host has queued the sample). Before timing, each implementation's output for
the same inputs is kept; the JSON gives ours against ORT's (max |difference| over max |ORT|).

Writes group_query_attention.json to --out, else $OUT, else bench/results.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ops.group_query_attention as gqa  # noqa: E402
from driver.device import bind, describe, make_device, make_session  # noqa: E402
from gpu_timing import graph_or_eager, op_bench_args, out_dir, run_impls, time_bound_run  # noqa: E402
from ops.group_query_attention import GqaConfig  # noqa: E402

IMPLS = ("ours", "ort")


def config(dry: bool) -> GqaConfig:
    if dry:
        return GqaConfig(num_heads=4, kv_num_heads=2, head_size=16, dtype="float16")
    return GqaConfig(num_heads=24, kv_num_heads=4, head_size=256, dtype="float16")


def cases(dry: bool) -> list[dict]:
    """(name, new tokens, cached positions, buffer positions) per case."""
    past, buffer, prefill = (32, 128, 64) if dry else (2048, 4096, 2048)
    decode = [{"name": f"S={s}", "seq": s, "past": past, "buffer": buffer} for s in (*range(1, 9), 16)]
    return decode + [{"name": f"prefill {prefill}", "seq": prefill, "past": 0, "buffer": buffer}]


def run_impl(device, impl: str, cfg: GqaConfig, seed: int, reps: int, calls: int, dry: bool) -> dict:
    xp = device.xp
    model = gqa.model(cfg, domain=gqa.SOURCE_DOMAIN if impl == "ort" else gqa.DOMAIN)

    def measure(graph: bool) -> dict:
        session = make_session(device, model, graph_capture=graph)
        results = {}
        for graph_id, case in enumerate(cases(dry), start=1):
            x = gqa.random_case(np.random.default_rng(seed + graph_id), cfg, 1, case["seq"], case["past"],
                                case["buffer"])
            bufs = {name: xp.asarray(v) for name, v in x.items() if name != "total_sequence_length"}
            outs = {"output": xp.full(x["query"].shape, np.nan, dtype=np.float16),
                    "present_key": bufs["past_key"], "present_value": bufs["past_value"]}  # shared buffer
            binding = session.io_binding()
            for name, buf in bufs.items():
                bind(binding, device, name, buf, buf.shape)
            # total_sequence_length is read on the host by ORT's kernel: a CPU input.
            binding.bind_cpu_input("total_sequence_length", x["total_sequence_length"])
            for name, buf in outs.items():
                bind(binding, device, name, buf, buf.shape, output=True)
            options = device.run_options(graph_id if graph else None)
            n = max(3, calls // 10) if case["seq"] > 16 else calls
            timing, out = time_bound_run(device, session, binding, options, n, reps,
                                         lambda y=outs["output"]: device.to_host(y).astype(np.float64))
            results[case["name"]] = {**case, **timing, "output": out}
            del binding, bufs, outs
        del session
        return {"cases": results}

    return graph_or_eager(device, measure)


def main(argv=None) -> int:
    args = op_bench_args(__doc__.split("\n\n")[0], argv, reps=11, calls=30)
    dry = args.cpu_dry_run
    device = make_device("cpu" if dry else "cuda", graph_capture=False)
    cfg = config(dry)
    report = {"script": "bench/group_query_attention.py", "argv": sys.argv[1:],
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "info": describe(device), "config": asdict(cfg),
              "batch": 1, "reps": args.reps, "calls": args.calls}
    report["impls"], report["errors"] = run_impls(
        device, IMPLS, lambda impl: run_impl(device, impl, cfg, args.seed, args.reps, args.calls, dry))
    impls = report["impls"]
    table = {}
    for case in cases(dry):
        name = case["name"]
        row = {impl: impls[impl]["cases"][name]["us"] for impl in impls if name in impls[impl]["cases"]}
        if "ours" in row and "ort" in row:
            ours, ort = impls["ours"]["cases"][name]["output"], impls["ort"]["cases"][name]["output"]
            row["ours_over_ort"] = row["ours"] / row["ort"]
            row["output_max_diff_over_max_ort"] = float(np.abs(ours - ort).max() / max(np.abs(ort).max(), 1e-30))
        table[name] = row
    for impl in impls.values():
        for entry in impl["cases"].values():
            entry.pop("output", None)
    report["table_us"] = table
    path = out_dir(args.out) / "group_query_attention.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"{'case':14s} {'ours us':>10s} {'ORT us':>10s} {'ours/ORT':>9s}  output diff vs ORT")
    for name, row in table.items():
        print(f"{name:14s} {row.get('ours', float('nan')):10.2f} {row.get('ort', float('nan')):10.2f} "
              f"{row.get('ours_over_ort', float('nan')):9.2f}  {row.get('output_max_diff_over_max_ort', float('nan')):.2e}")
    for e in report["errors"]:
        print(f"error in {e['impl']}: {e['error']}")
    print(f"wrote {path}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
