"""ort_mtp::MatMulNBits with a second weight set on the same A (CPU EP): inputs B2, scales2,
zero_points2, bias2 and attribute N2.

- Without an activation the node has two outputs, and each is bit for bit what a one-weight node
  computes for its weights (the two projections of one input in one node: A is quantised once and
  both weight sets are one job for the thread pool, which must not change a bit).
- With activation="swiglu" (N2 = N) the one output is silu(g) * u, g and u the two products rounded to
  the type as two nodes would write them, silu(g) = g / (1 + exp(-g)) in float32 with the op's own exp
  (matmul_nbits_cpu.cc, SiluMul: ~1 ulp): checked against that formula in numpy
  (ops.nbits.swiglu_reference) within 4 ulps, bit for bit across M (row i of an M-row call is the M=1
  call on row i) and threads, and between the AVX2 loop and the scalar one.
- A node that is not well formed is refused at session creation with an error naming what is wrong.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ops import nbits

SEED = int(os.environ.get("ORT_MTP_TEST_SEED", "0"))
NP_TYPES = {"float32": np.float32, "float16": np.float16}
ULP = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
MS = [1, 2, 3, 4, 5, 8, 9, 16]


def _model(w, second=None, activation=None, accuracy_level=4):
    return nbits.single_node_model(w, domain="ort_mtp", accuracy_level=accuracy_level, second=second,
                                   activation=activation, float32_io=w.dtype == "bfloat16")


def _feed(rng, M, K, dtype):
    a = nbits.round_to(rng.standard_normal((M, K)), dtype)
    return a.astype(NP_TYPES.get(dtype, np.float32))


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint8)


# (dtype, zero_points, bias, block_size, K, N, N2, accuracy_level): N and N2 not multiples of the
# kernel's column groups on most; accuracy_level 4 is the int8 kernel (one quantisation of A for both
# sets), 0 the float32 one (the two products one after the other).
CASES = [
    ("float32", None, False, 32, 256, 96, 40, 4),
    ("float32", None, True, 32, 1000, 70, 70, 4),
    ("float32", "packed", True, 16, 200, 45, 13, 4),
    ("float32", "typed", False, 128, 300, 37, 64, 4),
    ("float16", None, True, 64, 384, 33, 21, 4),
    ("bfloat16", "packed", False, 32, 96, 18, 18, 4),
    ("float32", None, True, 32, 160, 24, 9, 0),
    ("float16", "typed", False, 16, 64, 12, 20, 0),
]


def _case_id(c):
    return f"{c[0]}-zp_{c[1]}-bias{int(c[2])}-bs{c[3]}-K{c[4]}-N{c[5]}-N2{c[6]}-acc{c[7]}"


def _weights(case, rng, n2=None):
    dtype, zp, bias, bs, K, N, N2, _ = case
    w1 = nbits.random_weights(rng, K, N, block_size=bs, dtype=dtype, zero_points=zp, bias=bias)
    w2 = nbits.random_weights(rng, K, n2 or N2, block_size=bs, dtype=dtype, zero_points=zp, bias=bias)
    return w1, w2


@pytest.mark.parametrize("pack", ["1", "0"], ids=["grouped-copy", "row-major"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_two_outputs_are_the_one_weight_nodes_bits(case, pack, cpu_session, monkeypatch):
    """Y and Y2 of the two-weight node equal the two one-weight nodes' outputs bit for bit, at every M
    and with 1 and 2 threads, from the kernel's grouped copy and from the row-major weights."""
    monkeypatch.setenv("ORT_MTP_CPU_PACK", pack)
    dtype, acc = case[0], case[7]
    rng = np.random.default_rng([SEED, 71, case[4], case[5], case[6]])
    w1, w2 = _weights(case, rng)
    one = [cpu_session(_model(w, accuracy_level=acc)) for w in (w1, w2)]
    a = _feed(rng, max(MS), w1.K, dtype)
    for threads in (1, 2):
        pair = cpu_session(_model(w1, w2, accuracy_level=acc), threads=threads)
        for M in MS:
            y, y2 = pair.run(None, {"A": a[:M]})
            assert y.shape == (M, w1.N) and y2.shape == (M, w2.N)
            assert np.array_equal(_bits(y), _bits(one[0].run(None, {"A": a[:M]})[0])), f"threads={threads} M={M}: Y"
            assert np.array_equal(_bits(y2), _bits(one[1].run(None, {"A": a[:M]})[0])), f"threads={threads} M={M}: Y2"


@pytest.mark.parametrize("case", [c for c in CASES if c[5] == c[6] or c[7] == 4], ids=_case_id)
def test_swiglu_is_silu_of_the_gate_times_up(case, cpu_session):
    """activation="swiglu": within 4 ulps of silu(gate) * up computed from the one-weight nodes'
    outputs, rows bit for bit across M = 1..16 and threads."""
    dtype, acc = case[0], case[7]
    rng = np.random.default_rng([SEED, 72, case[4], case[5]])
    gate, up = _weights(case, rng, n2=case[5])
    one = [cpu_session(_model(w, accuracy_level=acc)) for w in (gate, up)]
    sessions = [cpu_session(_model(gate, up, "swiglu", accuracy_level=acc), threads=t) for t in (1, 2)]
    a = _feed(rng, max(MS), gate.K, dtype)
    singles = [sessions[0].run(None, {"A": a[i:i + 1]})[0] for i in range(len(a))]
    g, u = (s.run(None, {"A": a})[0] for s in one)
    want = nbits.swiglu_reference(g, u, dtype)
    got = np.concatenate(singles).astype(np.float32)
    tol = 4 * ULP[dtype] * np.abs(want) + 1e-30
    assert np.all(np.abs(got - want) <= tol), f"worst {np.max(np.abs(got - want) / tol):.3g} of the bound"
    assert np.any(got != 0) and np.any(got < 0) and np.any(got > 0)
    for t, s in enumerate(sessions, 1):
        for M in MS:
            y = s.run(None, {"A": a[:M]})[0]
            assert y.shape == (M, gate.N)
            for i in range(M):
                assert np.array_equal(_bits(y[i:i + 1]), _bits(singles[i])), f"threads={t} M={M}: row {i}"


def test_swiglu_of_extreme_gates(cpu_session):
    """Gates far out on either side: silu(g) -> g for large g and -> 0 for very negative g (exp(-g) is
    taken at min(-g, 88), a finite 2^127-range value), no overflow or NaN from the activation itself."""
    rng = np.random.default_rng([SEED, 73])
    gate = nbits.random_weights(rng, 64, 8, scale=4.0)
    up = nbits.random_weights(rng, 64, 8)
    session = cpu_session(_model(gate, up, "swiglu"))
    one = [cpu_session(_model(w)) for w in (gate, up)]
    a = _feed(rng, 4, 64, "float32") * np.float32(50)
    y = session.run(None, {"A": a})[0]
    g, u = (s.run(None, {"A": a})[0] for s in one)
    assert np.abs(g).max() > 100  # exp(-g) overflows for some, is 0 for others
    assert np.all(np.isfinite(y))
    want = nbits.swiglu_reference(g, u, "float32")
    assert np.all(np.abs(y - want) <= 4 * ULP["float32"] * np.abs(want) + 1e-30)


_VARIANT_PROBE = r"""
import sys, numpy as np, onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from ops import nbits
from tests import test_matmul_nbits_pair as t
out = []
for i, dtype in enumerate(["float32", "float16", "bfloat16"]):
    rng = np.random.default_rng([t.SEED, 75, i])
    gate = nbits.random_weights(rng, 96, 45, dtype=dtype, scale=0.5)
    up = nbits.random_weights(rng, 96, 45, dtype=dtype)
    a = t._feed(rng, 5, 96, dtype) * 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(sys.argv[2])
    session = ort.InferenceSession(t._model(gate, up, "swiglu").SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    y = session.run(None, {"A": a})[0]
    out.append(np.ascontiguousarray(y).view(np.uint8).reshape(-1))
np.save(sys.argv[3], np.concatenate(out))
print("ok")
"""


def test_swiglu_simd_and_scalar_agree_bitwise(library_path, tmp_path):
    """The epilogue's AVX2 loop (8 lanes, the rest scalar) and the scalar loop
    (ORT_MTP_CPU_KERNEL=reference, read once per process) give the same bits: one sequence of IEEE
    operations, fma included. Gates span about -40..40, so exp(-g) covers both ends of its range."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    results = {}
    for kernel in ("reference", "auto"):
        path = tmp_path / f"{kernel}.npy"
        env = dict(os.environ, ORT_MTP_CPU_KERNEL=kernel)
        run = subprocess.run([sys.executable, "-c", _VARIANT_PROBE, str(root), library_path, str(path)],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
        results[kernel] = np.load(path)
    assert np.array_equal(results["reference"], results["auto"])


def _refusal(cpu_session, model) -> str:
    with pytest.raises(Exception) as e:
        cpu_session(model)
    return str(e.value)


def _edited(model, edit):
    edit(model.graph.node[0], model.graph)
    return model


def _attr(node, name, value):
    from onnx import helper

    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


def test_errors_name_what_is_wrong(cpu_session):
    rng = np.random.default_rng([SEED, 74])
    w1 = nbits.random_weights(rng, 64, 16)
    w2 = nbits.random_weights(rng, 64, 8)
    w16 = nbits.random_weights(rng, 64, 16)
    zp2 = nbits.random_weights(rng, 64, 8, zero_points="packed")

    def pair(**kw):
        return _model(w1, w2, **kw)

    cases = [
        (_edited(pair(), lambda n, g: _attr(n, "N2", None)), "need attribute N2 > 0"),
        (_edited(pair(), lambda n, g: _attr(n, "N2", 9)), "input B2 has shape"),
        (_edited(_model(w1), lambda n, g: _attr(n, "N2", 16)), "N2 > 0 needs inputs B2 and scales2"),
        (_model(w1, zp2), "zero_points2 must be given exactly when zero_points is"),
        (_model(w1, w2, "swiglu"), "activation='swiglu' needs a second weight set of N columns"),
        (_edited(_model(w1, w16, "swiglu"), lambda n, g: _attr(n, "activation", "gelu")),
         "activation='gelu' is not supported"),
        (_edited(_model(w1, w16, "swiglu"), lambda n, g: _attr(n, "activation", 1)),
         "attribute 'activation' must be a string"),
        (_edited(_model(w1, w16, "swiglu"), lambda n, g: _attr(n, "N2", -1)), "attribute N2 must be in"),
        (_edited(_model(w1, w16, "swiglu"), lambda n, g: n.output.append("Y2")), "has 2 outputs, expected 1 (Y)"),
        (_edited(pair(), lambda n, g: (n.output.pop(), g.output.pop())), "has 1 outputs, expected 2 (Y, Y2"),
        (_edited(pair(), lambda n, g: _attr(n, "packing", 1)), "packing=1 (tiles) needs K a multiple of 256"),
        (_edited(_model(nbits.random_weights(rng, 256, 16), nbits.random_weights(rng, 256, 8)),
                 lambda n, g: _attr(n, "packing", 1)), "packing=1 (tiles) needs N2 a multiple of 16, got N2=8"),
    ]
    for model, needle in cases:
        message = _refusal(cpu_session, model)
        assert needle in message, f"{needle!r} not in: {message}"
        assert "'matmul'" in message  # the node is named
