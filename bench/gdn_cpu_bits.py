"""Two builds of the custom-op library against each other: ort_mtp::GatedDeltaNet's CPU outputs (y, the conv
state, the recurrent state, every window slot) bit for bit on random cases, for a change to the CPU
kernel that is meant to keep its bits.

    python bench/gdn_cpu_bits.py --a BEFORE/libort_mtp_ops.so --b AFTER/libort_mtp_ops.so [--out FILE]

Cases: float32, float16 and bfloat16 activations with a float32 or T state; (k heads, v heads, dk, dv) in
(2, 4, 32, 32), (2, 2, 64, 64), (1, 2, 128, 128), (2, 4, 16, 48); unwindowed and a window of 5; S = 1, 3, 7
(S <= the window); batch 2; random weights, inputs and past states (ops.gated_delta_net), 2 threads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ops.gated_delta_net as gdn  # noqa: E402


def session(library: str, model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    cases, differing = 0, []
    for dtype, state in (("float32", None), ("float16", "float32"), ("float16", None), ("bfloat16", "float32"),
                         ("bfloat16", None)):
        for hk, hv, dk, dv in ((2, 4, 32, 32), (2, 2, 64, 64), (1, 2, 128, 128), (2, 4, 16, 48)):
            for window in (0, 5):
                for seq in (1, 3, 7):
                    if window and seq > window:
                        continue
                    cfg = gdn.GdnConfig(hk, hv, dk, dv, state_window=window, dtype=dtype, state_dtype=state)
                    rng = np.random.default_rng([cases, 7])
                    weights = gdn.random_weights(rng, cfg)
                    inputs = gdn.random_inputs(rng, cfg, 2, seq)
                    f32 = dtype == "bfloat16"
                    model = gdn.gated_delta_net_model(cfg, weights, node_name="gdn", float32_io=f32)
                    feeds = gdn.feeds(inputs, cfg, float32_io=f32)
                    a, b = (session(lib, model).run(None, feeds) for lib in (args.a, args.b))
                    if not all(np.array_equal(np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8))
                               for x, y in zip(a, b)):
                        differing.append(f"{dtype} state={state} heads={hk}/{hv} dk={dk} dv={dv} window={window} S={seq}")
                    cases += 1
    result = {"command": "python bench/gdn_cpu_bits.py " + " ".join(sys.argv[1:]), "cases": cases,
              "bit_identical": cases - len(differing), "differing": differing}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
