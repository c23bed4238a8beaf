"""ort_mtp::MatMul against ONNX Runtime's MatMul (cuBLAS) on the CUDA EP, for the 27B-class Gated DeltaNet's
a/b projection (A [1, M, 5120] x B [5120, 48], float16, B an initializer as in the graphs):
M = 1..8 and 16 (decode and verify widths) and 2,048 (a prefill chunk); and ours_ab, the two-weight
node the rewrite makes of a layer's a and b projections (A x [B, B2] -> [Y, Y2], two 48-column
weights in one launch), against twice one projection.

    python bench/float_matmul.py [--out DIR] [--reps 11] [--calls 50]
    python bench/float_matmul.py --cpu-dry-run     # small shapes on the CPU EP: tests the script

Each implementation is a one-node session on the driver's CUDA device under ORT's CUDA graph (one
graph id per M; without it, saying so, if capture is refused), A and Y bound by IOBinding; a
measurement is gpu_timing.time_queued's median. Before timing, each output is kept: the JSON gives
ours against ORT's (max |difference| over max |ORT|).

Writes float_matmul.json to --out, else $OUT, else bench/results.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ops.float_matmul as fm  # noqa: E402
from driver.device import bind, describe, make_device, make_session  # noqa: E402
from gpu_timing import graph_or_eager, op_bench_args, out_dir, run_impls, time_bound_run  # noqa: E402

IMPLS = {"ours": ("ort_mtp", False), "ours_ab": ("ort_mtp", True), "ort": ("", False)}  # (domain, two weights)


def shape(dry: bool) -> tuple[int, int, list[int]]:
    """K, N and the row counts timed."""
    if dry:
        return 64, 8, [1, 2, 4, 32]
    return 5120, 48, [*range(1, 9), 16, 2048]


def run_impl(device, impl: str, seed: int, reps: int, calls: int, dry: bool) -> dict:
    xp = device.xp
    k, n, rows = shape(dry)
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
    domain, two = IMPLS[impl]
    weight2 = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16) if two else None
    model = fm.model(k, n, "float16", domain=domain, weight=weight, weight2=weight2)

    def measure(graph: bool) -> dict:
        session = make_session(device, model, graph_capture=graph)
        cases = {}
        for graph_id, m in enumerate(rows, start=1):
            a = xp.asarray(np.random.default_rng(seed + graph_id).standard_normal((1, m, k)).astype(np.float16))
            y = xp.full((1, m, n), np.nan, dtype=np.float16)
            y2 = xp.full((1, m, n), np.nan, dtype=np.float16) if two else None
            binding = session.io_binding()
            bind(binding, device, "A", a, a.shape)
            bind(binding, device, "Y", y, y.shape, output=True)
            if two:
                bind(binding, device, "Y2", y2, y2.shape, output=True)
            options = device.run_options(graph_id if graph else None)
            timing, out = time_bound_run(device, session, binding, options, calls, reps,
                                         lambda y=y: device.to_host(y).astype(np.float64))
            cases[f"M={m}"] = {"m": m, **timing, "output": out}
            del binding, a, y, y2
        del session
        return {"cases": cases}

    return graph_or_eager(device, measure)


def main(argv=None) -> int:
    args = op_bench_args(__doc__.split("\n\n")[0], argv, reps=11, calls=50)
    dry = args.cpu_dry_run
    device = make_device("cpu" if dry else "cuda", graph_capture=False)
    k, n, rows = shape(dry)
    report = {"script": "bench/float_matmul.py", "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "info": describe(device), "k": k, "n": n, "dtype": "float16", "reps": args.reps, "calls": args.calls}
    report["impls"], report["errors"] = run_impls(
        device, IMPLS, lambda impl: run_impl(device, impl, args.seed, args.reps, args.calls, dry))
    impls = report["impls"]
    table = {}
    for m in rows:
        name = f"M={m}"
        row = {impl: impls[impl]["cases"][name]["us"] for impl in impls if name in impls[impl]["cases"]}
        if "ours_ab" in row and "ours" in row:
            row["ours_ab_over_two_ours"] = row["ours_ab"] / (2 * row["ours"])
        if "ours" in row and "ort" in row:
            ours, ort = impls["ours"]["cases"][name]["output"], impls["ort"]["cases"][name]["output"]
            row["ours_over_ort"] = row["ours"] / row["ort"]
            row["output_max_diff_over_max_ort"] = float(np.abs(ours - ort).max() / max(np.abs(ort).max(), 1e-30))
        table[name] = row
    for impl in impls.values():
        for entry in impl["cases"].values():
            entry.pop("output", None)
    report["table_us"] = table
    path = out_dir(args.out) / "float_matmul.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"{'rows':8s} {'ours us':>10s} {'ORT us':>10s} {'ours/ORT':>9s} {'a+b us':>9s} {'/2 ours':>8s}  output diff vs ORT")
    for name, row in table.items():
        print(f"{name:8s} {row.get('ours', float('nan')):10.2f} {row.get('ort', float('nan')):10.2f} "
              f"{row.get('ours_over_ort', float('nan')):9.2f} {row.get('ours_ab', float('nan')):9.2f} "
              f"{row.get('ours_ab_over_two_ours', float('nan')):8.2f}  "
              f"{row.get('output_max_diff_over_max_ort', float('nan')):.2e}")
    for e in report["errors"]:
        print(f"error in {e['impl']}: {e['error']}")
    print(f"wrote {path}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
