"""Lane-level numpy emulation of GemvMmaKernel (csrc/matmul_nbits/gemv_mma.cuh, version 2), for
checking its index math on a machine without a GPU.

    python bench/emulate_gemv_mma.py        # the cases below, ~20 s; prints OK / FAIL per case
    python bench/emulate_gemv_mma.py 3      # only case 3

It replays, lane by lane, what the kernel does with addresses, for the work decomposition of
bench/gemv_plan.py (PlanMma's mirror) or one given explicitly: balanced row ranges (not a multiple of 16
rows), W = ceil(rows / 16) warps, the K-split over cluster ranks, the pipeline ring of `stages` stage
buffers (shared memory starts as random garbage; every byte a warp reads must have been written by a
copy, a zero-fill or the padding-token zeroing, else the case fails), the cp.async copy assignment
and both shared-memory swizzles, the ldmatrix.x4 distribution (lane (g, t) gets word t of row g of
each matrix), the activation prmt pairing, the int4 nibble pairing of Int4Dequant, the mma.m16n8k16
fragment layout (PTX ISA), per-quant-block scaling and the epilogue (m_valid tokens, rows_valid rows,
rank-order sums). Values stay exact (float64 of fp16 inputs and small integers), so an index mistake
shows as a mismatch with the float64 reference. It also checks that the same problem cut with other
row ranges and warp counts (the same K-split) gives bit-identical results, and that a row of an M-row
call equals the M=1 call. Keep it in step with the kernel when the kernel's layout changes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemv_plan  # noqa: E402


def prmt(a, b, sel):
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        out |= src[(sel >> (4 * i)) & 0x7] << (8 * i)
    return out


def swizzle(kc, r):
    return ((r >> 1) & 3) if kc == 128 else (r & 7)


def h2(x):
    return np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16).astype(np.float64)


def half_of(word, hsel):
    bits = (word >> 16) if hsel else (word & 0xFFFF)
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


class Smem:
    """Dynamic shared memory of one block: random bytes, plus a mask of the bytes written so far."""

    def __init__(self, size, rng):
        self.data = rng.integers(0, 256, size=size, dtype=np.uint8)
        self.written = np.zeros(size, dtype=bool)

    def write(self, addr, data):
        assert addr % 16 == 0 or len(data) < 16, f"misaligned copy to {addr}"
        assert 0 <= addr and addr + len(data) <= self.data.size, f"write past the end: {addr}+{len(data)}"
        self.data[addr:addr + len(data)] = data
        self.written[addr:addr + len(data)] = True

    def ld32(self, addr):
        assert addr % 4 == 0 and 0 <= addr and addr + 4 <= self.data.size, f"bad read at {addr}"
        if not self.written[addr:addr + 4].all():
            raise AssertionError(f"read of unwritten shared memory at byte {addr}")
        return int(self.data[addr:addr + 4].view(np.uint32)[0])


def make_problem(M, N, K, BS, zp_packed, rng):
    k_blocks = K // BS
    zp_row_bytes = (k_blocks + 1) // 2
    b = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
    scales = rng.uniform(0.5, 2.0, size=(N, k_blocks)).astype(np.float16)
    a = rng.uniform(-1, 1, size=(M, K)).astype(np.float16)
    zpb = rng.integers(0, 256, size=(N, zp_row_bytes), dtype=np.uint8) if zp_packed else None
    return dict(M=M, N=N, K=K, BS=BS, a=a, b=b, scales=scales, zpb=zpb, zp_row_bytes=zp_row_bytes)


def reference(pr):
    N, K, BS = pr["N"], pr["K"], pr["BS"]
    q = np.zeros((N, K), dtype=np.int64)
    q[:, 0::2] = pr["b"] & 15
    q[:, 1::2] = pr["b"] >> 4
    if pr["zpb"] is not None:
        zfull = np.zeros((N, 2 * pr["zp_row_bytes"]), dtype=np.int64)
        zfull[:, 0::2] = pr["zpb"] & 15
        zfull[:, 1::2] = pr["zpb"] >> 4
        z = zfull[:, :K // BS]
    else:
        z = np.full((N, K // BS), 8)
    w = (q - np.repeat(z, BS, axis=1)) * np.repeat(pr["scales"].astype(np.float64), BS, axis=1)
    return pr["a"].astype(np.float64) @ w.T


def emulate(pr, KC, NT, splits, rows_per_block, stages, rng, eager=False):
    """The kernel's output for problem `pr` cut as given (float64; NaN where nothing was stored)."""
    M, N, K, BS = pr["M"], pr["N"], pr["K"], pr["BS"]
    zp_packed = pr["zpb"] is not None
    W = -(-rows_per_block // 16)
    threads = 32 * W
    rows_cap = 16 * W
    kTokens = 8 * NT
    kRowBytes = KC // 2
    kUnits = KC // 32
    kSpc = KC // BS
    kScaleBytes = 2 * kSpc
    kAUnits = KC // 8
    w_bytes = rows_cap * kRowBytes
    a_bytes = kTokens * KC * 2
    scale_base = w_bytes + a_bytes
    stage_bytes = scale_base + rows_cap * kScaleBytes
    red_stride = rows_cap + 4
    assert stages * stage_bytes >= kTokens * red_stride * 4, "reduction buffer does not fit"
    k_blocks = K // BS
    row_bytes = K // 2
    kchunks = K // KC
    assert kchunks >= splits, "a K-slice without chunks"
    assert W <= gemv_plan.MAX_WARPS, f"{W} warps"
    b_flat = pr["b"].reshape(-1)
    s_bytes = pr["scales"].view(np.uint8).reshape(-1)
    a_bytes_flat = pr["a"].view(np.uint8).reshape(-1)
    zp_flat = pr["zpb"].reshape(-1) if zp_packed else None
    zp_row_bytes = pr["zp_row_bytes"]
    y = np.full((M, N), np.nan)
    row_blocks = -(-N // rows_per_block)
    for gy in range(-(-M // kTokens)):
        tok0 = gy * kTokens
        m_valid = min(kTokens, M - tok0)
        for rb in range(row_blocks):
            row0 = rb * rows_per_block
            row_end = min(N, row0 + rows_per_block)
            reds = []
            for split in range(splits):
                c_begin = split * kchunks // splits
                c_end = (split + 1) * kchunks // splits
                smem = Smem(stages * stage_bytes, rng)
                # cp.async groups: a copy lands when a wait_group releases its group (eager=False), or
                # at once (eager=True): both orders must give the same result.
                groups, current = [], []

                def cp(addr, data):
                    if eager:
                        smem.write(addr, data)
                    else:
                        current.append((addr, np.array(data, dtype=np.uint8)))

                def commit():
                    groups.append(list(current))
                    current.clear()

                def wait_group(n):
                    while len(groups) > n:
                        for addr, data in groups.pop(0):
                            smem.write(addr, data)

                next_w_chunk = [c_begin]  # the kernel's weight/scale sources advance one chunk per issue

                def issue_weights(buf):
                    chunk = next_w_chunk[0]
                    next_w_chunk[0] += 1
                    assert chunk < c_end, "weights copied past the K-slice"
                    base = buf * stage_bytes
                    for tid in range(threads):
                        w_par, w_row = tid & 1, tid >> 1
                        n = row0 + w_row
                        for j in range(kUnits // 2):
                            dst = base + w_row * kRowBytes + 16 * ((w_par + 2 * j) ^ swizzle(KC, w_row))
                            if n < row_end:
                                src = n * row_bytes + chunk * kRowBytes + 16 * w_par + 32 * j
                                cp(dst, b_flat[src:src + 16])
                            else:
                                cp(dst, np.zeros(16, np.uint8))
                        if tid < rows_cap:
                            dst = base + scale_base + tid * kScaleBytes
                            if row0 + tid < row_end:
                                src = 2 * ((row0 + tid) * k_blocks + chunk * kSpc)
                                cp(dst, s_bytes[src:src + kScaleBytes])
                            else:
                                cp(dst, np.zeros(kScaleBytes, np.uint8))

                def issue_activations(buf, chunk):
                    assert c_begin <= chunk < c_end, "activations copied past the K-slice"
                    base = buf * stage_bytes
                    for tid in range(threads):
                        for idx in range(tid, m_valid * kAUnits, threads):
                            tok, unit = idx // kAUnits, idx % kAUnits
                            dst = base + w_bytes + tok * (KC * 2) + 16 * (unit ^ ((tok & 1) << 2))
                            src = 2 * (tok0 * K) + 2 * chunk * KC + tok * 2 * K + 16 * unit
                            cp(dst, a_bytes_flat[src:src + 16])

                nchunks = c_end - c_begin
                for s in range(stages - 1):
                    if s < nchunks:
                        issue_weights(s)
                    commit()
                # padding tokens of every stage, zeroed once (ordinary stores)
                pad_units = (kTokens - m_valid) * (KC * 2 // 16)
                for s in range(stages):
                    for idx in range(pad_units):
                        smem.write(s * stage_bytes + w_bytes + m_valid * KC * 2 + 16 * idx, np.zeros(16, np.uint8))
                for s in range(stages - 1):
                    if s < nchunks:
                        issue_activations(s, c_begin + s)
                    commit()
                acc, part = {}, {}
                read_buf, write_buf = 0, stages - 1
                for it in range(nchunks):
                    chunk = c_begin + it
                    wait_group(stages - 2)
                    if it + stages - 1 < nchunks:
                        issue_weights(write_buf)
                        issue_activations(write_buf, c_begin + it + stages - 1)
                    commit()
                    write_buf = 0 if write_buf == stages - 1 else write_buf + 1
                    base = read_buf * stage_bytes
                    read_buf = 0 if read_buf == stages - 1 else read_buf + 1
                    # --- compute ---
                    for warp in range(W):
                        warp_row = warp * 16
                        if not row0 + warp_row < row_end:
                            continue  # warp past the range: copies only
                        lanes = range(32)
                        ld_off = {(l, qq): (warp_row + (l & 7)) * kRowBytes
                                  + 16 * ((4 * qq + (l >> 3)) ^ swizzle(KC, warp_row + (l & 7)))
                                  for l in lanes for qq in range(kUnits // 4)}
                        b_even = {l: w_bytes + (l >> 2) * (KC * 2) + 16 * (l & 3) + 64 * ((l >> 2) & 1) for l in lanes}
                        b_odd = {l: w_bytes + (l >> 2) * (KC * 2) + 16 * (l & 3) - 64 * ((l >> 2) & 1) for l in lanes}
                        s_off = {l: scale_base + (warp_row + (l >> 2)) * kScaleBytes for l in lanes}
                        sc = {(l, hf, wi): smem.ld32(base + s_off[l] + hf * 8 * kScaleBytes + 4 * wi)
                              for l in lanes for hf in range(2) for wi in range(max(1, kSpc // 2))}
                        zc = {}
                        for l in lanes:
                            for hf in range(2):
                                n = row0 + warp_row + hf * 8 + (l >> 2)
                                packed = 0
                                if zp_packed and n < row_end:
                                    for byte in range(kSpc // 2):
                                        packed |= int(zp_flat[n * zp_row_bytes + chunk * (kSpc // 2) + byte]) << (8 * byte)
                                zc[(l, hf)] = packed
                        for qq in range(kUnits // 4):
                            words = {}
                            for hf in range(2):
                                addrs = {l: base + ld_off[(l, qq)] + hf * 8 * kRowBytes for l in lanes}
                                for l in lanes:
                                    g, t = l >> 2, l & 3
                                    for i in range(4):
                                        words[(l, hf, i)] = smem.ld32(addrs[8 * i + g] + 4 * t)
                            for j in range(4):
                                unit = 4 * qq + j
                                upb = BS // 32
                                blk = unit // upb
                                block_end = (unit + 1) % upb == 0
                                bfrag = {}
                                for l in lanes:
                                    for nt in range(NT):
                                        addr = base + (b_odd[l] if unit & 1 else b_even[l]) + 64 * unit + nt * 8 * (KC * 2)
                                        v = [smem.ld32(addr + 4 * i) for i in range(4)]
                                        bfrag[(l, nt)] = [prmt(v[0], v[2], 0x5410), prmt(v[0], v[2], 0x7632),
                                                          prmt(v[1], v[3], 0x5410), prmt(v[1], v[3], 0x7632)]
                                afr = {}
                                for l in lanes:
                                    out = []
                                    for hf in range(2):
                                        wd = words[(l, hf, j)]
                                        zz = ((zc[(l, hf)] >> (4 * blk)) & 15) if zp_packed else 8
                                        nib = [(wd >> (4 * i)) & 15 for i in range(8)]
                                        out.append([(nib[0] - zz, nib[4] - zz), (nib[1] - zz, nib[5] - zz),
                                                    (nib[2] - zz, nib[6] - zz), (nib[3] - zz, nib[7] - zz)])
                                    lo, hi = out
                                    afr[l] = ([lo[0], hi[0], lo[1], hi[1]], [lo[2], hi[2], lo[3], hi[3]])
                                for nt in range(NT):
                                    for step in range(2):
                                        A = np.zeros((16, 16))
                                        B = np.zeros((16, 8))
                                        for l in lanes:
                                            g, t = l >> 2, l & 3
                                            regs = afr[l][step]
                                            A[g, 2 * t:2 * t + 2] = regs[0]
                                            A[g + 8, 2 * t:2 * t + 2] = regs[1]
                                            A[g, 2 * t + 8:2 * t + 10] = regs[2]
                                            A[g + 8, 2 * t + 8:2 * t + 10] = regs[3]
                                            breg = bfrag[(l, nt)][2 * step:2 * step + 2]
                                            B[2 * t:2 * t + 2, g] = h2(breg[0])
                                            B[2 * t + 8:2 * t + 10, g] = h2(breg[1])
                                        D = A @ B
                                        for l in lanes:
                                            g, t = l >> 2, l & 3
                                            vals = [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]
                                            for i in range(4):
                                                key = (warp, l, nt, i)
                                                part[key] = part.get(key, 0.0) + vals[i]
                                if block_end:
                                    for l in lanes:
                                        s_lo = half_of(sc[(l, 0, blk >> 1)], blk & 1)
                                        s_hi = half_of(sc[(l, 1, blk >> 1)], blk & 1)
                                        for nt in range(NT):
                                            for i in range(4):
                                                key = (warp, l, nt, i)
                                                acc[key] = acc.get(key, 0.0) + (s_lo if i < 2 else s_hi) * part.get(key, 0.0)
                                                part[key] = 0.0
                # epilogue: [token][row] buffer
                red = np.full(kTokens * red_stride, np.nan)
                for warp in range(W):
                    for l in range(32):
                        g, t = l >> 2, l & 3
                        for nt in range(NT):
                            r = warp * 16 + g
                            tok = nt * 8 + 2 * t
                            get = lambda i: acc.get((warp, l, nt, i), 0.0)  # noqa: E731
                            red[tok * red_stride + r] = get(0)
                            red[(tok + 1) * red_stride + r] = get(1)
                            red[tok * red_stride + r + 8] = get(2)
                            red[(tok + 1) * red_stride + r + 8] = get(3)
                reds.append(red)
            rows_valid = row_end - row0
            for split in range(splits):
                r_begin = split * rows_valid // splits
                r_count = (split + 1) * rows_valid // splits - r_begin
                for idx in range(r_count * m_valid):
                    tok, r = idx // r_count, r_begin + idx % r_count
                    off = tok * red_stride + r
                    total = reds[0][off]
                    for c in range(1, splits):
                        total = total + reds[c][off]
                    y[tok0 + tok, row0 + r] = total
    return y


def check(M, N, K, BS, NT, zp_packed, splits=None, rows_per_block=None, stages=None, rng=None):
    """One case: the plan of gemv_plan (or the given cut) against the float64 reference. Returns
    (relative error, unwritten outputs)."""
    pr = make_problem(M, N, K, BS, zp_packed, rng)
    plan = gemv_plan.plan(N, K, BS)
    KC = plan.kc
    splits = plan.splits if splits is None else splits
    rows_per_block = plan.rows_per_block if rows_per_block is None else rows_per_block
    if stages is None:
        p2 = gemv_plan.Plan(KC, splits, rows_per_block, -(-N // rows_per_block), -(-rows_per_block // 16))
        stages = gemv_plan.stages(p2, K, BS, 8 * NT)
    y = emulate(pr, KC, NT, splits, rows_per_block, stages, rng)
    ref = reference(pr)
    return float(np.nanmax(np.abs(y - ref)) / max(1e-9, np.max(np.abs(ref)))), int(np.isnan(y).sum()), pr, y


CASES = [
    # M, N, K, BS, NT, zp, splits, rows_per_block, stages   (None: from gemv_plan's H200 plan)
    (3, 70, 512, 32, 1, False, None, None, None),      # plan: 16-row ranges, 1 warp
    (5, 130, 512, 32, 1, True, 2, 44, 3),               # 3 warps, last range 42 rows, 2 ranks
    (11, 70, 512, 32, 2, False, 1, 35, 2),              # 16 tokens, 2-stage ring, ranges of 35
    (16, 129, 384, 64, 2, True, 2, 128, 3),             # KC 128 (K % 256 != 0), 8 warps, then 1 row
    (2, 64, 512, 128, 1, False, 2, 21, 5),              # block 128, uneven ranges
    (9, 40, 1024, 256, 2, True, 1, 40, 2),              # KC 512, 16 tokens, 2 token passes
    (4, 100, 384, 32, 1, True, 3, 100, 4),              # KC 128, 3 uneven slices
    (1, 128, 768, 64, 1, False, 3, 128, 2),             # 8 warps, ring shorter than the slice
    (17, 33, 256, 32, 2, False, 1, 17, 3),              # M > 16: two token passes, 17-row ranges
    (2, 20, 2048, 32, 1, False, 1, 20, 3),              # 8 chunks through a 3-stage ring
    (10, 24, 2560, 32, 2, True, 2, 24, 4),              # 5 chunks per slice through a 4-stage ring
]


def main(argv) -> int:
    rng = np.random.default_rng(0)
    only = int(argv[1]) if len(argv) > 1 else None
    failed = 0
    for i, c in enumerate(CASES):
        if only is not None and i != only:
            continue
        M, N, K, BS, NT, zp, splits, rows, stages = c
        try:
            err, nans, pr, y = check(M, N, K, BS, NT, zp, splits, rows, stages, rng)
            ok = err < 1e-12 and nans == 0
            # The same K-split with another cut of the rows (and another ring) must give the same bits;
            # and a row of the M-row call must equal the M=1 call on that row.
            plan = gemv_plan.plan(N, K, BS)
            s = plan.splits if splits is None else splits
            r = plan.rows_per_block if rows is None else rows
            other = emulate(pr, plan.kc, NT, s, 16 if r != 16 else min(N, 40), 2, rng)
            same_cut = bool(np.array_equal(other, y))
            single = dict(pr, M=1, a=pr["a"][M - 1:M])
            y1 = emulate(single, plan.kc, 1, s, r, 2, rng)
            same_m = bool(np.array_equal(y1[0], y[M - 1]))
            # Copies landing at once instead of at their wait_group: the same bits (no ring hazard).
            st = stages if stages is not None else gemv_plan.stages(
                gemv_plan.Plan(plan.kc, s, r, -(-N // r), -(-r // 16)), K, BS, 8 * NT)
            eager = bool(np.array_equal(emulate(pr, plan.kc, NT, s, r, st, rng, eager=True), y))
            ok = ok and same_cut and same_m and eager
            detail = (f"rel err {err:.1e}, unwritten {nans}, same bits with another cut {same_cut}, "
                      f"row {M - 1} == M=1 {same_m}, eager copies {eager}")
        except AssertionError as e:
            ok, detail = False, f"assertion: {e}"
        failed += not ok
        print(i, c, detail, "OK" if ok else "FAIL", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
