"""How close GatedDeltaNet's float32 kernel comes to the op fuzz's y bound: over random valid float32
cases of tests/op_fuzz.py's generator, the largest |y - reference| in units of U32 x (y_magnitude + |y|)
(ops.gated_delta_net.reference(..., magnitudes=True)); the fuzz allows 64 of them.

    ORT_MTP_LIBRARY=<CPU build> python bench/results/2026-12-05-op-fuzz-seeds/gdn_bound.py [--cases 400]
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402

import op_fuzz as F  # noqa: E402
from ops import gated_delta_net as gdn  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--seed", type=int, default=12345)
    args = ap.parse_args()
    cases_rng, ratios = np.random.default_rng(args.seed), []
    while len(ratios) < args.cases:
        case = F.gated_delta_net_case(cases_rng)
        if case["mutations"] or case["dtype"] != "float32" or case["batch"] == 0:
            continue
        rng = np.random.default_rng(case["choice"])
        cfg = gdn.GdnConfig(case["num_k_heads"], case["num_v_heads"], case["k_head_dim"], case["v_head_dim"],
                            conv_kernel=case["conv_kernel"], state_window=case["state_window"], dtype="float32")
        weights = gdn.random_weights(rng, cfg, conv_bias=case["conv_bias"])
        inputs = gdn.random_inputs(rng, cfg, case["batch"], case["seq"])
        session = F.make_session(gdn.gated_delta_net_model(cfg, weights, node_name=F.NODE), "cpu")
        names = {i.name for i in session.get_inputs()}
        feeds = gdn.feeds(inputs, cfg, None)
        y = np.asarray(session.run(None, {k: v for k, v in feeds.items() if k in names})[0], np.float64)
        want = gdn.reference(cfg, weights, inputs, magnitudes=True)
        ref = want["y"].astype(np.float64)
        ratios.append(float(np.max(np.abs(y - ref) / (F.U32 * (want["y_magnitude"] + np.abs(ref)) + 1e-300))))
    ratios.sort()
    print(f"{len(ratios)} float32 cases: largest error / (U32 x (y_magnitude + |y|)) {ratios[-1]:.2f}, "
          f"median {ratios[len(ratios) // 2]:.2f}, the ten largest {[round(r, 2) for r in ratios[-10:]]}")


if __name__ == "__main__":
    main()
