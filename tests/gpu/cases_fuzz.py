"""tests/op_fuzz.py's random cases for the library's ops on the device under test (groups op-fuzz-seed*).

The same kind of cases as tests/test_ops_fuzz.py runs on the CPU EP (seeds 0 and 1): random
shapes, element types, declared output types, attributes, bound buffers, weights as initializers or
graph inputs, each a valid base with zero to two contract-breaking mutations. A valid case must equal
the reference (CopySlots bitwise, MatMulNBits within the float64 reference's rounding bound), a
mutated one must give ONNX Runtime's error (on CUDA, a bad value only the attention kernels' device-side
checks see, op_fuzz.DEVICE_CHECKED, must give NaN output rows instead: outcome "nan"), and none may crash the process: on the CUDA EP that also
covers the CUDA kernels' own checks and their launches on odd shapes. One record per case; a crash
names the case that was running (rerun it alone with the record's `reproduce` command).
"""

from __future__ import annotations

import sys

from harness import ROOT, Context

sys.path.insert(0, str(ROOT / "tests"))
import op_fuzz  # noqa: E402

OPS = ("CopySlots", "MatMulNBits", "GatedDeltaNet", "GroupQueryAttention", "GatedAttention",
       "MatMulNBitsPair", "SkipSimplifiedLayerNormalization")  # op_fuzz.CASE_MAKERS
CASES = 225 * len(OPS)  # case i runs op i % len(OPS)
SEEDS = (0, 1)
OUTCOMES = tuple(f"{op} {outcome}" for op in OPS for outcome in ("ok", "error"))


def check_op_fuzz(ctx: Context, seed: int, cases: int = CASES):
    provider = "cuda" if ctx.on_gpu else "cpu"
    for index in range(cases):
        case = op_fuzz.make_case(seed, index)
        label = f"seed {seed} case {index} ({case['op']}, mutations {case['mutations'] or 'none'})"
        ctx.started(label)
        try:
            outcome, problem = op_fuzz.run_case(case, provider), None
        except op_fuzz.CaseFailure as e:
            outcome, problem = "FAILED", str(e)
        yield {"case": label, "op": case["op"], "outcome": outcome, "ok": problem is None, "problem": problem,
               "reproduce": f"python tests/op_fuzz.py --provider {provider} --seed {seed} --case {index}"}


def outcome_counts(records: list[dict]) -> dict[str, int]:
    """'<op> <outcome>' -> cases, as op_fuzz.py's summary counts them."""
    counts: dict[str, int] = {}
    for r in records:
        if "op" in r:
            key = f"{r['op']} {r['outcome']}"
            counts[key] = counts.get(key, 0) + 1
    return counts
