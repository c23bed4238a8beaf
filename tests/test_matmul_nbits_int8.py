"""ort_mtp::MatMulNBits at accuracy_level 4 on the CPU EP: the int8-activation kernel.

What it computes (matmul_nbits_cpu.cc, "Int8"): A quantised to int8 per row and weight block
(s = max|a| / 127 in float32, qa = round-half-even(a / s) clamped to +-127), exact integer dot
products per 32-element segment (16 for block_size 16), then per segment position s = 0..3 of a chunk
acc[s] = fma(float(d), float32(scale_w * s_a), acc[s]) over the chunks in ascending order,
(acc0 + acc1) + (acc2 + acc3), + bias.

Tolerances, from the arithmetic (u32 = 2^-24):
- Against ops.nbits.int8_reference (float64 from the same int8 quantisation, emulated exactly): the
  integers are exact, so only the float combination rounds: the product scale_w * s (1 rounding), the
  fma per chunk (1 per chunk: <= ceil(kp / 64) chains of roundings per lane), the lane tree (<= 4),
  the bias add (1), and for typed zero points one more per term: within (chunks + 8) u32 mag8, mag8 =
  sum |scale_w s| sum |qa| (|q| + |zp|) + |bias| (what int8_reference returns beside Y). float16 and
  bfloat16 outputs add the final rounding (u16 |y|, 2^-8 |y|) and a subnormal floor.
- Against ONNX Runtime's com.microsoft::MatMulNBits at accuracy_level 4 (MLAS' int8 path): MLAS
  quantises A with the same block scale (max|a| / 127) and rounds a * (127 / max|a|) to nearest even;
  that product and our quotient a / s differ by a few float32 ulps, so a qa can differ by one where
  a / s lies within those ulps of a half-integer: rare, and each such flip moves y by |s scale_w (q - zp)|.
  Its float combination is its own (K-long float32 chain at worst). The bound used: our bound against
  the reference + (K + 8) u32 mag8 for ORT's float rounding + 2 flips' worth per output,
  2 max_b |s_b| max|scale_w (q - zp)|. (Measured: they agree to float32 rounding on these cases.)
  Typed (float) zero points: ORT's CPU op does not take its int8 path for them (its result equals
  the exact fp32 one), so those are checked against the reference only.
- Against exact arithmetic (nbits.reference): the int8 rounding of A, |qa s - a| <= s / 2 per element
  plus float32 rounding: sum_k s_b / 2 |w[n, k]| + float32 terms (checked loosely, as a sanity bound).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ops import nbits

SEED = int(os.environ.get("ORT_MTP_TEST_SEED", "0"))
U32 = 2.0**-24
U16 = 2.0**-11
UBF16 = 2.0**-8
NP_TYPES = {"float32": np.float32, "float16": np.float16}
ROOT = Path(__file__).resolve().parents[1]


def _session(library_path, model, threads=1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library_path)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _model(w, domain="ort_mtp", accuracy_level=4):
    return nbits.single_node_model(w, domain=domain, accuracy_level=accuracy_level,
                                   float32_io=w.dtype == "bfloat16")


def _feed(a, dtype):
    return a.astype(NP_TYPES.get(dtype, np.float32))


def _chunks(w):
    """Chunks of 4 segments (32 k, or 16 for block_size 16): the fma chain of a segment position."""
    kp = w.k_blocks * w.block_size
    return -(-kp // (4 * min(32, w.block_size)))


def check_int8_reference(y, a, w):
    ref, mag = nbits.int8_reference(a, w)
    final = {"float32": 0.0, "float16": U16, "bfloat16": UBF16}[w.dtype]
    tol = (_chunks(w) + 8) * U32 * mag + final * np.abs(ref) + 2.0**-24
    err = np.abs(y - ref)
    assert np.all(err <= tol), f"max error {err.max():.3g} vs int8 reference, worst ratio {np.max(err / tol):.3g}"


def _activations(rng, M, K, dtype):
    a = rng.standard_normal((M, K))
    if M > 1:
        a[M // 2, : min(K, 40)] = 0.0  # an all-zero block (s = 0) in one row
    return nbits.round_to(a, dtype)


# (dtype, zero_points, bias, block_size, K, N): K not a multiple of block_size on several (partial
# last block), N not a multiple of 4 (the kernel's column groups) on most.
CASES = [
    ("float32", None, False, 32, 1024, 96),
    ("float32", None, True, 32, 1000, 70),
    ("float32", "packed", True, 16, 200, 45),
    ("float32", "packed", False, 64, 384, 33),
    ("float32", "typed", True, 128, 300, 37),
    ("float32", None, True, 256, 600, 21),
    ("float32", None, False, 16, 72, 19),
    ("float16", None, True, 32, 250, 41),
    ("float16", "packed", False, 128, 512, 66),
    ("bfloat16", None, True, 64, 320, 29),
    ("bfloat16", "typed", False, 32, 96, 18),
]
BITWISE_MS = list(range(1, 17)) + [32]


def _case_id(c):
    return f"{c[0]}-zp_{c[1]}-bias{int(c[2])}-bs{c[3]}-K{c[4]}-N{c[5]}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_rows_bitwise_across_m_and_threads(case, library_path):
    """Row i of an M-row call equals the M=1 call on row i bit for bit, M = 1..16 and a 32-row
    prefill, with 1 and 2 intra-op threads; 1 and 2 threads agree; every output is within float32
    rounding of the int8 reference."""
    dtype, zp, bias, bs, K, N = case
    rng = np.random.default_rng([SEED, 40, K, N, bs])
    w = nbits.random_weights(rng, K, N, bits=4, block_size=bs, dtype=dtype, zero_points=zp, bias=bias)
    sessions = {t: _session(library_path, _model(w), t) for t in (1, 2)}
    a = _activations(rng, max(BITWISE_MS), K, dtype)
    feed = _feed(a, dtype)
    singles = [sessions[1].run(None, {"A": feed[i : i + 1]})[0] for i in range(len(feed))]
    for t, s in sessions.items():
        for M in BITWISE_MS:
            batch = s.run(None, {"A": feed[:M]})[0]
            for i in range(M):
                assert np.array_equal(batch[i : i + 1].view(np.uint8), singles[i].view(np.uint8)), \
                    f"threads={t} M={M}: row {i} differs from the M=1 call"
    check_int8_reference(np.concatenate(singles).astype(np.float64), a, w)


# The SIMD kernel reads any constant 4-bit weights from its own grouped copy (matmul_nbits.h,
# kCpuGroups), padded to whole groups of 4 columns and chunks of 4 segments: these take every kind of
# zero point, partial last blocks, N not a multiple of 4 and K not a multiple of a chunk.
PACKED_CASES = [
    ("float32", None, False, 32, 1024, 96),
    ("float32", None, True, 16, 256, 8),
    ("float32", None, False, 128, 640, 20),
    ("float16", None, True, 64, 384, 12),
    ("float16", None, False, 32, 256, 64),
    ("bfloat16", None, True, 128, 512, 4),
    ("float32", "packed", True, 32, 1000, 70),
    ("float32", "typed", False, 64, 300, 37),
    ("float16", "packed", False, 16, 200, 45),
    ("bfloat16", "typed", True, 256, 600, 21),
]


@pytest.mark.parametrize("case", PACKED_CASES, ids=_case_id)
def test_grouped_copy_gives_the_row_major_bits(case, library_path, monkeypatch):
    """The kernel's grouped copy of constant weights (the default where it applies) and the row-major
    weights as stored (ORT_MTP_CPU_PACK=0, read when a session creates its kernels) give the same bits
    at every M and thread count: the layout only moves bytes."""
    dtype, zp, bias, bs, K, N = case
    rng = np.random.default_rng([SEED, 41, K, N, bs])
    w = nbits.random_weights(rng, K, N, bits=4, block_size=bs, dtype=dtype, zero_points=zp, bias=bias)
    monkeypatch.setenv("ORT_MTP_CPU_PACK", "0")
    plain = _session(library_path, _model(w), 2)
    monkeypatch.delenv("ORT_MTP_CPU_PACK")
    grouped = {t: _session(library_path, _model(w), t) for t in (1, 2)}
    feed = _feed(_activations(rng, 9, K, dtype), dtype)
    for M in (1, 2, 3, 4, 5, 8, 9):
        want = plain.run(None, {"A": feed[:M]})[0]
        for t, s in grouped.items():
            assert np.array_equal(s.run(None, {"A": feed[:M]})[0].view(np.uint8), want.view(np.uint8)), \
                f"threads={t} M={M}: the grouped copy's result differs from the row-major one"


def _has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx2() or os.environ.get("ORT_MTP_CPU_KERNEL") == "reference",
                    reason="the grouped copy is for the SIMD int8 kernels (AVX2 and up), not the scalar reference")
def test_the_grouped_copy_is_made_where_it_applies(library_path, monkeypatch, capfd):
    """The kernel says, in the session's log at INFO, when it made its grouped copy: for every node of
    constant weights the int8 kernel runs (N not a multiple of 4 and zero points included: the copy
    pads), not with ORT_MTP_CPU_PACK=0, not for a node on the float32 kernel (accuracy_level 0)."""
    import onnxruntime as ort

    rng = np.random.default_rng([SEED, 42])

    def says_grouped(w, accuracy_level=4) -> bool:
        options = ort.SessionOptions()
        options.log_severity_level = 1  # INFO
        options.register_custom_ops_library(library_path)
        model = nbits.single_node_model(w, domain="ort_mtp", accuracy_level=accuracy_level, node_name="mm")
        capfd.readouterr()
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return "MatMulNBits node 'mm': the CPU int8 kernel reads a grouped copy" in capfd.readouterr().err

    w = nbits.random_weights(rng, 256, 16, bits=4, block_size=32, dtype="float32")
    odd = nbits.random_weights(rng, 256, 18, bits=4, block_size=32, dtype="float32")
    zero_points = nbits.random_weights(rng, 256, 16, bits=4, block_size=32, dtype="float32", zero_points="packed")
    assert says_grouped(w) and says_grouped(odd) and says_grouped(zero_points)
    assert not says_grouped(w, accuracy_level=0)
    monkeypatch.setenv("ORT_MTP_CPU_PACK", "0")
    assert not says_grouped(w)


@pytest.mark.skipif(not _has_avx2() or os.environ.get("ORT_MTP_CPU_KERNEL") == "reference",
                    reason="the grouped copy is for the SIMD int8 kernels (AVX2 and up), not the scalar reference")
def test_kernels_with_equal_weights_share_one_grouped_copy(library_path, monkeypatch, capfd):
    """Kernels of one process whose grouped copies hold the same bytes share one (the MTP head's
    lm_head is the main model's): the log says how many others share it; weights differing in one
    nibble, in one scale or in one zero point get their own (also where the difference lies between the
    places the lookup key samples, so only the full comparison can find it); a copy is dropped with its
    last kernel; and each session still computes with its own weights (against the row-major path,
    ORT_MTP_CPU_PACK=0)."""
    import onnxruntime as ort

    rng = np.random.default_rng([SEED, 43])  # weights no other test's live session holds

    def session(w, threads=2):
        options = ort.SessionOptions()
        options.log_severity_level = 1  # INFO
        options.intra_op_num_threads = threads
        options.register_custom_ops_library(library_path)
        model = nbits.single_node_model(w, domain="ort_mtp", accuracy_level=4, node_name="mm")
        capfd.readouterr()
        s = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        said = [line for line in capfd.readouterr().err.splitlines() if "MatMulNBits node 'mm'" in line]
        assert len(said) == 1, said
        return s, said[0]

    w = nbits.random_weights(rng, 512, 64, bits=4, block_size=32, dtype="float32", zero_points="packed")
    other = nbits.random_weights(rng, 512, 64, bits=4, block_size=32, dtype="float32", zero_points="packed")
    other.b[...] = w.b
    other.zero_points[...] = w.zero_points
    other.b.reshape(-1)[-1] ^= 0x10  # the last column's last weight: one nibble apart from w
    other.scales[...] = w.scales

    def apart(what, at, flip):
        """w with one byte of B, one scale or one zero point changed, at flat index `at`."""
        changed = copy.deepcopy(w)
        getattr(changed, what).reshape(-1)[at] = flip(getattr(changed, what).reshape(-1)[at])
        return changed

    # The key samples 64 bytes at 64 evenly spaced places of B (16 KiB here: every 259 bytes) and the
    # two ends of scales and zero points; these differences lie between them.
    variants = {"one nibble": other, "nibble between samples": apart("b", 100, lambda v: v ^ 0x01),
                "scale": apart("scales", 500, lambda v: -v), "zero point": apart("zero_points", 200, lambda v: v ^ 0x11)}
    first, said_first = session(w)
    second, said_second = session(w, threads=1)
    own = {name: session(v) for name, v in variants.items()}
    assert "0 other kernel(s)" in said_first
    assert "1 other kernel(s)" in said_second
    for name, (_, said) in own.items():
        assert "0 other kernel(s)" in said, f"weights differing in a {name} shared a copy"
    monkeypatch.setenv("ORT_MTP_CPU_PACK", "0")
    plain = {"w": _session(library_path, _model(w), 2)}
    plain.update({name: _session(library_path, _model(v), 2) for name, v in variants.items()})
    monkeypatch.delenv("ORT_MTP_CPU_PACK")
    feed = _feed(_activations(rng, 4, 512, "float32"), "float32")
    want = {name: s.run(None, {"A": feed})[0] for name, s in plain.items()}
    for name in variants:
        assert not np.array_equal(want["w"], want[name]), name
        assert np.array_equal(own[name][0].run(None, {"A": feed})[0], want[name]), name
    for sharing in (first, second):
        assert np.array_equal(sharing.run(None, {"A": feed})[0], want["w"])
    del first, second, own, sharing
    _, said_again = session(w)
    assert "0 other kernel(s)" in said_again, "a copy outlived every kernel that used it"


@pytest.mark.skipif(not _has_avx2() or os.environ.get("ORT_MTP_CPU_KERNEL") == "reference",
                    reason="the grouped copy is for the SIMD int8 kernels (AVX2 and up), not the scalar reference")
def test_sessions_created_at_once_share_one_grouped_copy(library_path, capfd):
    """Sessions of equal weights created on several threads at the same time (the copies are compared
    and packed outside the table's lock) still end with one shared copy: a session made afterwards
    shares it with every one of them, and each computes what a session made alone does."""
    import threading

    import onnxruntime as ort

    rng = np.random.default_rng([SEED, 47])  # weights no other test's live session holds
    w = nbits.random_weights(rng, 2048, 1024, bits=4, block_size=32, dtype="float32", zero_points="packed")
    model = nbits.single_node_model(w, domain="ort_mtp", accuracy_level=4, node_name="mm").SerializeToString()

    def options():
        o = ort.SessionOptions()
        o.log_severity_level = 1  # INFO: the kernel says how many others share its copy
        o.intra_op_num_threads = 1
        o.register_custom_ops_library(library_path)
        return o

    threads, start = 4, threading.Barrier(4)
    made, errors = [None] * threads, []

    def make(i):
        try:
            start.wait()
            made[i] = ort.InferenceSession(model, options(), providers=["CPUExecutionProvider"])
        except Exception as e:  # reported below, with the thread's index
            errors.append((i, e))

    workers = [threading.Thread(target=make, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    capfd.readouterr()
    last = ort.InferenceSession(model, options(), providers=["CPUExecutionProvider"])
    said = [line for line in capfd.readouterr().err.splitlines() if "MatMulNBits node 'mm'" in line]
    assert len(said) == 1 and f"{threads} other kernel(s)" in said[0], said
    feed = _feed(_activations(rng, 3, 2048, "float32"), "float32")
    want = last.run(None, {"A": feed})[0]
    for s in made:
        assert np.array_equal(s.run(None, {"A": feed})[0], want)


@pytest.mark.parametrize("case", [c for c in CASES if c[1] != "typed" and c[0] != "bfloat16"], ids=_case_id)
def test_matches_onnxruntime_accuracy_level_4(case, cpu_session):
    dtype, zp, bias, bs, K, N = case
    rng = np.random.default_rng([SEED, 41, K, N, bs])
    w = nbits.random_weights(rng, K, N, bits=4, block_size=bs, dtype=dtype, zero_points=zp, bias=bias)
    a = _activations(rng, 7, K, dtype)
    ours = cpu_session(_model(w)).run(None, {"A": _feed(a, dtype)})[0].astype(np.float64)
    theirs = cpu_session(_model(w, "com.microsoft")).run(None, {"A": _feed(a, dtype)})[0].astype(np.float64)
    ref, mag = nbits.int8_reference(a, w)
    _, s = nbits.int8_quantize(a, bs)
    wq = np.abs(nbits.quant_values(w) - nbits.per_k(nbits.zero_point_values(w), w)) * nbits.per_k(np.abs(w.scales), w)
    flip = 2 * s.max(axis=1)[:, None] * wq.max(axis=1)[None, :]
    tol = (K + _chunks(w) + 16) * U32 * mag + flip
    if dtype == "float16":
        tol = tol + 2 * U16 * np.maximum(np.abs(ours), np.abs(theirs)) + 2.0**-24
    err = np.abs(ours - theirs)
    assert np.all(err <= tol), f"max |ours - ORT| {err.max():.3g}, worst ratio {np.max(err / tol):.3g}"
    check_int8_reference(ours, a, w)


def test_int8_error_against_exact_is_the_quantisation_error(cpu_session):
    """Sanity: level 4 differs from exact arithmetic by about the int8 rounding of A, not more."""
    rng = np.random.default_rng([SEED, 42])
    w = nbits.random_weights(rng, 512, 64, block_size=32, zero_points="packed", bias=True)
    a = _activations(rng, 3, 512, "float32")
    y = cpu_session(_model(w)).run(None, {"A": a})[0].astype(np.float64)
    _, s = nbits.int8_quantize(a, 32)
    bound = (nbits.per_k(s, w) / 2) @ np.abs(nbits.dequantize(w)).T + 1e-5 * nbits.magnitude(a, w)
    err = np.abs(y - nbits.reference(a, w))
    assert np.all(err <= bound)
    assert err.max() > 0  # it is the int8 path, not the exact one


def test_other_accuracy_levels_and_8_bits_keep_the_float32_kernel(cpu_session):
    """accuracy_level 0..3 (and 4 with 8-bit weights) are the float32 kernel: the same bits as no attribute."""
    rng = np.random.default_rng([SEED, 43])
    a = _activations(rng, 4, 256, "float32")
    for bits in (4, 8):
        w = nbits.random_weights(rng, 256, 24, bits=bits, block_size=32, bias=True)
        plain = cpu_session(nbits.single_node_model(w, domain="ort_mtp")).run(None, {"A": a})[0]
        for level in (0, 1, 2, 3) + ((4,) if bits == 8 else ()):
            y = cpu_session(_model(w, accuracy_level=level)).run(None, {"A": a})[0]
            assert np.array_equal(y.view(np.uint8), plain.view(np.uint8)), f"bits={bits} level={level}"
    w = nbits.random_weights(rng, 256, 24, bits=4, block_size=32, bias=True)
    plain = cpu_session(nbits.single_node_model(w, domain="ort_mtp")).run(None, {"A": a})[0]
    assert not np.array_equal(cpu_session(_model(w)).run(None, {"A": a})[0], plain)


_KERNEL_PROBE = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from ops import nbits
from tests import test_matmul_nbits_int8 as t
library = sys.argv[2]
out = []
for i, (dtype, zp, bias, bs, K, N) in enumerate(t.CASES):
    rng = np.random.default_rng([t.SEED, 44, i])
    w = nbits.random_weights(rng, K, N, bits=4, block_size=bs, dtype=dtype, zero_points=zp, bias=bias)
    a = t._activations(rng, 6, K, dtype)
    s = t._session(library, t._model(w), 2)
    y = s.run(None, {"A": t._feed(a, dtype)})[0]
    t.check_int8_reference(y.astype(np.float64), a, w)
    for row in range(6):
        one = s.run(None, {"A": t._feed(a[row:row + 1], dtype)})[0]
        assert np.array_equal(one.view(np.uint8), y[row:row + 1].view(np.uint8))
    out.append(np.ascontiguousarray(y).view(np.uint8).reshape(-1))
np.save(sys.argv[3], np.concatenate(out))
print("ok")
"""


def test_kernel_variants_agree_bitwise(library_path, tmp_path):
    """ORT_MTP_CPU_KERNEL picks the int8 kernel (read once per process): each meets the reference
    bound and keeps rows independent of M, and all of them (scalar 'reference', AVX2 maddubs, AVX-VNNI,
    AVX-512BW maddubs, AVX-512 VNNI) give the same bits: each lane of the definition is one column's
    segment, whatever the vector width. (On a CPU without an instruction set, its choice falls back
    and the comparison still holds.)"""
    results = {}
    for kernel in ("reference", "avx2", "avxvnni", "avx512-novnni", "avx512"):
        path = tmp_path / f"{kernel}.npy"
        env = dict(os.environ, ORT_MTP_CPU_KERNEL=kernel)
        run = subprocess.run([sys.executable, "-c", _KERNEL_PROBE, str(ROOT), library_path, str(path)],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
        results[kernel] = np.load(path)
    for kernel, result in results.items():
        assert np.array_equal(result, results["reference"]), f"{kernel} differs from the scalar kernel"


def test_int8_reference_emulates_the_quantisation():
    """int8_quantize: scale max|a| / 127, round half to even, +-127, zero blocks give 0."""
    a = np.array([[127.0, 63.5, -0.5, 0.5, 1.5, -127.0] + [0.0] * 10 + [0.0] * 16], np.float32)
    qa, s = nbits.int8_quantize(a, 16)
    assert s[0, 0] == np.float32(127.0) / np.float32(127) and s[0, 1] == 0
    assert list(qa[0, :6]) == [127, 64, -0, 0, 2, -127] and not qa[0, 16:].any()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not _has_avx2() or os.environ.get("ORT_MTP_CPU_KERNEL") == "reference"
                    or not Path("/proc/self/statm").exists(),
                    reason="the grouped copy is for the SIMD int8 kernels; resident memory read from /proc")
def test_grouped_copies_are_freed_with_their_sessions(library_path):
    """The grouped copies live in shared chunks of huge-page memory (common/huge_page_bytes.h): small copies
    share a chunk, large ones get their own, and a chunk goes back to the system with the last copy in it,
    so sessions created and dropped one after another do not pile up memory. 16 rounds of two sessions
    with 8 MiB of distinct weights each (a pile-up would keep ~256 MiB), outputs checked against the
    row-major path on every round."""
    rng = np.random.default_rng([SEED, 44])
    big = nbits.random_weights(rng, 4096, 4096, bits=4, block_size=32, dtype="float32")  # 8 MiB of int4
    small = nbits.random_weights(rng, 512, 256, bits=4, block_size=32, dtype="float32")
    feed = _feed(_activations(rng, 2, 4096, "float32"), "float32")
    small_feed = _feed(_activations(rng, 2, 512, "float32"), "float32")
    os.environ["ORT_MTP_CPU_PACK"] = "0"
    try:
        want = _session(library_path, _model(big), 2).run(None, {"A": feed})[0]
        want_small = _session(library_path, _model(small), 2).run(None, {"A": small_feed})[0]
    finally:
        del os.environ["ORT_MTP_CPU_PACK"]
    start = None
    for round_ in range(16):
        if round_:
            big.b.reshape(-1)[round_] ^= 0x11  # distinct bytes every round: no copy is shared across rounds
            os.environ["ORT_MTP_CPU_PACK"] = "0"
            try:
                want = _session(library_path, _model(big), 2).run(None, {"A": feed})[0]
            finally:
                del os.environ["ORT_MTP_CPU_PACK"]
        sessions = [_session(library_path, _model(big), 2), _session(library_path, _model(small), 2)]
        assert np.array_equal(sessions[0].run(None, {"A": feed})[0], want)
        assert np.array_equal(sessions[1].run(None, {"A": small_feed})[0], want_small)
        del sessions
        if round_ == 1:
            start = _resident_bytes()
    assert _resident_bytes() - start < 64 << 20, "grouped copies outlived their sessions"
