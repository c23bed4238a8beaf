"""ort_mtp::MatMulNBits on the CPU EP against ONNX Runtime's com.microsoft::MatMulNBits and against a
float64 numpy reference.

Tolerances, from the arithmetic. u32 = 2^-24 and u16 = 2^-11 are the unit roundoffs of float32 and
float16. mag[m, n] = sum_k |a| |scale| (|q| + |zp|) + |bias| (ops.nbits.magnitude) bounds every
product and partial sum either kernel forms, however it groups (q - zp) * scale.
- Ours, the reference kernel (ORT_MTP_CPU_KERNEL=reference): w = (q - zp) * scale in float (two
  roundings: <= 2 u32 |w|), products and sums in double (error ~K 2^-53, negligible), one rounding
  to float (<= u32 |y|, and |y| <= mag): within 4 u32 mag of the exact value in float32.
- Ours, the fast kernel (the default on AVX2/AVX-512 CPUs, matmul_nbits_cpu.cc): per block,
  q - zp in float (exact for integer zero points, one rounding for typed ones), a float32 chain of
  block_size / W products per SIMD lane (W = 8 or 16: <= block_size / 8 roundings), then
  acc = fma(block sum, scale, acc) (one rounding per block: <= k_blocks), a lane reduction (<= 4),
  the bias add (1): every term passes through at most n = block_size / 8 + k_blocks + 6 roundings,
  so the result is within gamma_n mag ~ n u32 mag; the tests use (block_size / 8 + k_blocks + 8) u32
  mag (FAST_ROUNDINGS). For block_size >= 16 that is below tests/op_fuzz.py's (K / 16 + 64) u32 mag.
- ORT CPU (fp32 compute; fp16 inputs are widened to fp32, contrib_ops/cpu/quantization/matmul_nbits.cc):
  dequantisation as (q - zp) * scale or q * scale - zp * scale (<= 2 u32 mag), a float32 dot product
  of length K in any order or with FMA (<= K u32 mag, the standard gamma_K bound), the bias add
  (<= u32 mag).
  So float32 outputs agree within (K + 4) u32 mag plus our bound: (K + FAST_ROUNDINGS + 4) u32 mag.
- float16 outputs are both rounded once more from float32; two numbers rounded to nearest differ by
  at most their distance plus one float16 ulp (2 u16 |y|), plus the subnormal spacing 2^-24.
- Against the float64 reference: FAST_ROUNDINGS u32 mag for float32 (4 for the reference kernel), plus the final rounding u16 |y| (float16) or
  2^-8 |y| (bfloat16's unit roundoff) and a subnormal floor.
A wrong nibble, block, zero point or scale moves an output by about |scale| * |a| >> these bounds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest

from ops import nbits

SEED = int(os.environ.get("ORT_MTP_TEST_SEED", "0"))
U32 = 2.0**-24
U16 = 2.0**-11
UBF16 = 2.0**-8
NP_TYPES = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class Case:
    index: int
    dtype: str
    bits: int
    zero_points: str | None
    bias: bool
    block_size: int
    M: int
    K: int
    N: int
    accuracy_level: int | None

    def __str__(self):
        return (f"{self.dtype}-b{self.bits}-zp_{self.zero_points}-bias{int(self.bias)}-bs{self.block_size}"
                f"-M{self.M}-K{self.K}-N{self.N}")

    def rng(self):
        return np.random.default_rng([SEED, self.index])


def _draw(index, dtype, bits, zero_points, bias, block_size, *, M=None, odd_n=True, whole_blocks=True):
    rng = np.random.default_rng([SEED, 1_000_000 + index])
    k_blocks = int(rng.integers(1, 5))
    K = k_blocks * block_size if whole_blocks else k_blocks * block_size - int(rng.integers(1, block_size))
    N = int(rng.integers(1, 40)) * 2 + (1 if odd_n else int(rng.integers(0, 2)))
    M = M if M is not None else index % 16 + 1
    accuracy_level = [None, 0, 1][index % 3]  # 4 would let ORT quantise A to int8: not comparable
    return Case(index, dtype, bits, zero_points, bias, block_size, M, K, N, accuracy_level)


def _ort_cases() -> list[Case]:
    """Every combination ORT's CPU op runs (it has no 8-bit typed zero points) x bias x block size,
    twice: whole blocks with odd N, and a partial last block with any N; M cycles through 1..16.
    Then large-M cases."""
    cases = []
    combos = [(d, b, z) for d in ("float32", "float16") for b in (4, 8) for z in (None, "packed", "typed")
              if not (z == "typed" and b == 8)]
    for dtype, bits, zp in combos:
        for bias in (False, True):
            for block_size in (16, 32, 64, 128, 256):
                cases.append(_draw(len(cases), dtype, bits, zp, bias, block_size, odd_n=True, whole_blocks=True))
                cases.append(_draw(len(cases), dtype, bits, zp, bias, block_size, odd_n=False, whole_blocks=False))
    for dtype, bits, zp in combos:
        cases.append(_draw(len(cases), dtype, bits, zp, True, 32, M=int(100 + 23 * len(cases) % 200), whole_blocks=False))
    return cases


ORT_CASES = _ort_cases()


def _activations(rng, M, K, dtype):
    return nbits.round_to(rng.standard_normal((M, K)), dtype)


def _run(session_factory, w, a, domain, accuracy_level=None):
    model = nbits.single_node_model(w, domain=domain, accuracy_level=accuracy_level,
                                    float32_io=w.dtype == "bfloat16")
    feed = a.astype(NP_TYPES.get(w.dtype, np.float32))
    return session_factory(model).run(None, {"A": feed})[0].astype(np.float64)


def fast_roundings(w) -> int:
    """The most float32 roundings any term of an output passes through in the fast kernel (see the
    module docstring), with slack 2."""
    return w.block_size // 8 + w.k_blocks + 8


def _check_reference(y, a, w, roundings=None):
    ref, mag = nbits.reference(a, w), nbits.magnitude(a, w)
    final = {"float32": 0.0, "float16": U16, "bfloat16": UBF16}[w.dtype]
    roundings = fast_roundings(w) if roundings is None else roundings
    tol = roundings * U32 * mag + final * np.abs(ref) + 2.0**-24
    err = np.abs(y - ref)
    assert np.all(err <= tol), f"max error {err.max():.3g} vs reference, worst ratio {np.max(err / tol):.3g}"


def test_case_coverage():
    """The ORT comparison covers what the spec asks for."""
    assert len(ORT_CASES) >= 200
    assert {c.M for c in ORT_CASES} >= set(range(1, 17)) and max(c.M for c in ORT_CASES) > 64
    assert {c.block_size for c in ORT_CASES} == {16, 32, 64, 128, 256}
    assert {(c.zero_points, c.bias, c.dtype, c.bits) for c in ORT_CASES} >= {
        (z, b, d, 4) for z in (None, "packed", "typed") for b in (False, True) for d in ("float32", "float16")}
    assert any(c.N % 2 for c in ORT_CASES) and any(c.K % c.block_size for c in ORT_CASES)


@pytest.mark.parametrize("case", ORT_CASES, ids=str)
def test_matches_onnxruntime(case, cpu_session):
    rng = case.rng()
    w = nbits.random_weights(rng, case.K, case.N, bits=case.bits, block_size=case.block_size,
                             dtype=case.dtype, zero_points=case.zero_points, bias=case.bias)
    a = _activations(rng, case.M, case.K, case.dtype)
    ours = _run(cpu_session, w, a, "ort_mtp")
    theirs = _run(cpu_session, w, a, "com.microsoft", case.accuracy_level)
    assert ours.shape == theirs.shape == (case.M, case.N)
    tol = (case.K + fast_roundings(w) + 4) * U32 * nbits.magnitude(a, w)
    if case.dtype == "float16":
        tol = tol + 2 * U16 * np.maximum(np.abs(ours), np.abs(theirs)) + 2.0**-24
    err = np.abs(ours - theirs)
    assert np.all(err <= tol), f"seed {SEED}: max |ours - ORT| {err.max():.3g}, worst ratio {np.max(err / tol):.3g}"
    _check_reference(ours, a, w)


REFERENCE_CASES = [
    # bfloat16 (ORT's CPU op has no bfloat16 kernel) and 8-bit typed zero points (ORT's CPU op
    # rejects them) against the float64 reference only.
    _draw(5000 + i, dtype, bits, zp, bias, bs, odd_n=bool(i % 2), whole_blocks=i % 3 != 0)
    for i, (dtype, bits, zp, bias, bs) in enumerate(
        [("bfloat16", b, z, bias, bs) for b in (4, 8) for z in (None, "packed", "typed") for bias in (False, True)
         for bs in (16, 128)]
        + [(d, 8, "typed", bias, bs) for d in ("float32", "float16") for bias in (False, True) for bs in (32, 256)])
]


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=str)
def test_matches_float64_reference(case, cpu_session):
    rng = case.rng()
    w = nbits.random_weights(rng, case.K, case.N, bits=case.bits, block_size=case.block_size,
                             dtype=case.dtype, zero_points=case.zero_points, bias=case.bias)
    a = _activations(rng, case.M, case.K, case.dtype)
    _check_reference(_run(cpu_session, w, a, "ort_mtp"), a, w)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M,K,N,block_size", [(16, 96, 33, 32), (7, 300, 130, 64), (40, 256, 257, 256)])
def test_rows_are_independent(dtype, M, K, N, block_size, cpu_session):
    """Row i of an M-row call equals the M=1 call on row i, bit for bit (the property the verify
    step relies on to stay lossless). N >= 32 splits the work over threads."""
    rng = np.random.default_rng([SEED, 7, M, K, N])
    w = nbits.random_weights(rng, K, N, block_size=block_size, dtype=dtype, zero_points="packed", bias=True)
    a = _activations(rng, M, K, dtype)
    model = nbits.single_node_model(w, domain="ort_mtp", float32_io=dtype == "bfloat16")
    session = cpu_session(model)
    feed = a.astype(NP_TYPES.get(dtype, np.float32))
    batch = session.run(None, {"A": feed})[0]
    for i in range(M):
        single = session.run(None, {"A": feed[i : i + 1]})[0]
        assert np.array_equal(batch[i : i + 1].view(np.uint8), single.view(np.uint8)), f"row {i} differs"


def test_leading_dims_are_flattened(cpu_session):
    rng = np.random.default_rng([SEED, 8])
    w = nbits.random_weights(rng, 64, 24, block_size=16, zero_points="packed")
    a = _activations(rng, 6, 64, "float32")
    model3 = nbits.single_node_model(w, domain="ort_mtp", a_shape=(2, 3, None))
    y3 = cpu_session(model3).run(None, {"A": a.reshape(2, 3, 64)})[0]
    y2 = cpu_session(nbits.single_node_model(w, domain="ort_mtp")).run(None, {"A": a})[0]
    assert y3.shape == (2, 3, 24)
    assert np.array_equal(y3.reshape(6, 24), y2)


def test_flat_scales_and_zero_points_are_accepted(cpu_session):
    """scales [N * k_blocks] and zero_points [N * zp_row_bytes] mean the same as the 2-D forms."""
    rng = np.random.default_rng([SEED, 9])
    w = nbits.random_weights(rng, 80, 9, block_size=32, zero_points="packed", bias=True)
    a = _activations(rng, 3, 80, "float32")
    y2d = cpu_session(nbits.single_node_model(w, domain="ort_mtp")).run(None, {"A": a})[0]
    flat = nbits.NBitsWeights(w.K, w.N, w.bits, w.block_size, w.dtype, w.b, w.scales,
                              w.zero_points.reshape(-1), w.bias)
    y1d = cpu_session(nbits.single_node_model(flat, domain="ort_mtp", flat_scales=True)).run(None, {"A": a})[0]
    assert np.array_equal(y1d, y2d)
    _check_reference(y1d.astype(np.float64), a, w)


def test_empty_a_gives_empty_output(cpu_session):
    """M = 0 is a valid call with an empty result, not an error."""
    rng = np.random.default_rng([SEED, 10])
    w = nbits.random_weights(rng, 32, 8, block_size=16)
    session = cpu_session(nbits.single_node_model(w, domain="ort_mtp"))
    y = session.run(None, {"A": np.zeros((0, 32), np.float32)})[0]
    assert y.shape == (0, 8)


# -- the fast CPU kernel: bitwise row independence across M and thread counts, and the reference path --

BITWISE_MS = list(range(1, 10)) + [16, 33]
BITWISE_CASES = [
    # (dtype, bits, zero_points, bias, block_size, K, N): the common case first, then the rest.
    ("float32", 4, None, False, 32, 1024, 96),
    ("float32", 4, "packed", True, 64, 512, 70),
    ("float32", 4, None, True, 128, 384, 33),
    ("float32", 4, "typed", True, 16, 200, 45),
    ("float32", 8, "packed", False, 256, 600, 37),
    ("float16", 4, "packed", True, 32, 300, 66),
    ("float16", 8, "typed", False, 64, 256, 19),
    ("bfloat16", 4, None, True, 32, 250, 41),
]


def _threaded_session(library_path, model, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library_path)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("dtype,bits,zp,bias,block_size,K,N", BITWISE_CASES)
def test_fast_kernel_rows_bitwise_across_m_and_threads(dtype, bits, zp, bias, block_size, K, N, library_path):
    """Row i of an M-row call equals the M=1 call on row i bit for bit, for M = 1..9, 16, 33, with 1 and
    2 intra-op threads, and the two thread counts agree bit for bit; each output is within the fast
    kernel's float32 bound of the float64 reference."""
    rng = np.random.default_rng([SEED, 11, K, N, bits, block_size])
    w = nbits.random_weights(rng, K, N, bits=bits, block_size=block_size, dtype=dtype, zero_points=zp, bias=bias)
    model = nbits.single_node_model(w, domain="ort_mtp", float32_io=dtype == "bfloat16")
    sessions = {t: _threaded_session(library_path, model, t) for t in (1, 2)}
    a = _activations(rng, max(BITWISE_MS), K, dtype)
    feed = a.astype(NP_TYPES.get(dtype, np.float32))
    singles = {t: [s.run(None, {"A": feed[i : i + 1]})[0] for i in range(len(feed))] for t, s in sessions.items()}
    for i in range(len(feed)):
        assert np.array_equal(singles[1][i].view(np.uint8), singles[2][i].view(np.uint8)), f"M=1 row {i}: 1 vs 2 threads"
    for t, s in sessions.items():
        for M in BITWISE_MS:
            batch = s.run(None, {"A": feed[:M]})[0]
            for i in range(M):
                assert np.array_equal(batch[i : i + 1].view(np.uint8), singles[1][i].view(np.uint8)), \
                    f"threads={t} M={M}: row {i} differs from the M=1 call"
    _check_reference(np.concatenate(singles[1]).astype(np.float64), a, w)


_KERNEL_PROBE = r"""
import sys, numpy as np, onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from ops import nbits
from tests import test_matmul_nbits as t
library, roundings = sys.argv[2], sys.argv[3]
worst = 0.0
for i, (dtype, bits, zp, bias, bs, K, N) in enumerate(t.BITWISE_CASES):
    rng = np.random.default_rng([t.SEED, 12, i])
    w = nbits.random_weights(rng, K, N, bits=bits, block_size=bs, dtype=dtype, zero_points=zp, bias=bias)
    a = t._activations(rng, 5, K, dtype)
    s = t._threaded_session(library, nbits.single_node_model(w, domain="ort_mtp", float32_io=dtype == "bfloat16"), 2)
    y = s.run(None, {"A": a.astype(t.NP_TYPES.get(dtype, np.float32))})[0].astype(np.float64)
    t._check_reference(y, a, w, None if roundings == "fast" else int(roundings))
    for row in range(5):
        one = s.run(None, {"A": a[row:row + 1].astype(t.NP_TYPES.get(dtype, np.float32))})[0].astype(np.float64)
        assert np.array_equal(one[0], y[row])
print("ok")
"""


@pytest.mark.parametrize("kernel,roundings", [("reference", "4"), ("avx2", "fast"), ("auto", "fast")])
def test_cpu_kernel_selection(kernel, roundings, library_path):
    """ORT_MTP_CPU_KERNEL (read once per process) picks the kernel: the double reference stays
    reachable and keeps its 4 u32 bound; avx2 and the default meet the fast kernel's bound and keep
    rows independent of M. (On a CPU without AVX2 every choice runs the reference.)"""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, ORT_MTP_CPU_KERNEL=kernel)
    out = subprocess.run([sys.executable, "-c", _KERNEL_PROBE, str(root), library_path, roundings],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
