"""Lane-level numpy emulation of GemvMmaKernel (csrc/matmul_nbits/gemv_mma.cuh), for checking its
index math on a machine without a GPU.

    python bench/emulate_gemv_mma.py        # 8 configurations, ~3 s; prints OK / FAIL per case

It replays, lane by lane, what the kernel does with addresses: the cp.async copy assignment and both
shared-memory swizzles, the ldmatrix.x4 distribution (lane (g, t) gets word t of row g of each
matrix), the activation prmt pairing, the int4 nibble pairing of Int4Dequant, the mma.m16n8k16
fragment layout (PTX ISA), per-quant-block scaling, the K-split over cluster ranks and the epilogue.
Values stay exact (float64 of fp16 inputs and small integers), so any index mistake shows as a
mismatch with the float64 reference. Keep it in step with the kernel when the kernel's layout changes.
"""
import sys

import numpy as np


def prmt(a, b, sel):
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        out |= src[(sel >> (4 * i)) & 0x7] << (8 * i)
    return out


def swizzle(kc, r):
    return ((r >> 1) & 3) if kc == 128 else (r & 7)


def emulate(M, N, K, BS, KC, NT, TM, zp_packed, splits, rng):
    kRows = 128
    kWarps = kRows // (16 * TM)
    kThreads = 32 * kWarps
    kTokens = 8 * NT
    kRowBytes = KC // 2
    kUnits = KC // 32
    kSpc = KC // BS
    kScaleBytes = 2 * kSpc
    kWBytes = kRows * kRowBytes
    kABytes = kTokens * KC * 2
    kSBytes = kRows * kScaleBytes
    kStageBytes = kWBytes + kABytes + kSBytes
    k_blocks = K // BS
    row_bytes = K // 2
    kchunks = K // KC
    zp_row_bytes = (k_blocks + 1) // 2

    b = rng.integers(0, 256, size=(N, row_bytes), dtype=np.uint8)
    scales = rng.uniform(0.5, 2.0, size=(N, k_blocks)).astype(np.float16)
    a = rng.uniform(-1, 1, size=(M, K)).astype(np.float16)
    zpb = rng.integers(0, 256, size=(N, zp_row_bytes), dtype=np.uint8)
    # reference
    q = np.zeros((N, K), dtype=np.int64)
    q[:, 0::2] = b & 15
    q[:, 1::2] = b >> 4
    if zp_packed:
        zfull = np.zeros((N, 2 * zp_row_bytes), dtype=np.int64)
        zfull[:, 0::2] = zpb & 15
        zfull[:, 1::2] = zpb >> 4
        z = zfull[:, :k_blocks]
    else:
        z = np.full((N, k_blocks), 8)
    w = (q - np.repeat(z, BS, axis=1)) * np.repeat(scales.astype(np.float64), BS, axis=1)
    ref = a.astype(np.float64) @ w.T

    b_flat = b.reshape(-1)
    s_bytes = scales.view(np.uint8).reshape(-1)
    a_bytes = a.view(np.uint8).reshape(-1)
    zp_flat = zpb.reshape(-1)
    y = np.full((M, N), np.nan)
    tiles = (N + kRows - 1) // kRows
    groups = (M + kTokens - 1) // kTokens
    for gy in range(groups):
        tok0 = gy * kTokens
        for tile in range(tiles):
            row0 = tile * kRows
            reds = []
            for split in range(splits):
                c_begin = split * kchunks // splits
                c_end = (split + 1) * kchunks // splits
                acc = {}  # (warp, lane, tm, nt, i) -> float
                part = {}
                for chunk in range(c_begin, c_end):
                    smem = np.zeros(kStageBytes, dtype=np.uint8)
                    # --- issue_weights ---
                    kRowsPerPass = kThreads // 2
                    kWPasses = kRows // kRowsPerPass
                    for tid in range(kThreads):
                        w_par, w_row = tid & 1, tid >> 1
                        for ps in range(kWPasses):
                            n = row0 + w_row + ps * kRowsPerPass
                            for j in range(kUnits // 2):
                                dst = w_row * kRowBytes + 16 * ((w_par + 2 * j) ^ swizzle(KC, w_row)) + ps * kRowsPerPass * kRowBytes
                                if n < N:
                                    src = n * row_bytes + chunk * kRowBytes + 16 * w_par + 32 * j
                                    smem[dst:dst + 16] = b_flat[src:src + 16]
                        if tid < kRows and row0 + tid < N:
                            src = 2 * ((row0 + tid) * k_blocks + chunk * kSpc)
                            dst = kWBytes + kABytes + tid * kScaleBytes
                            smem[dst:dst + kScaleBytes] = s_bytes[src:src + kScaleBytes]
                    # --- issue_activations ---
                    kAUnits = KC // 8
                    kATotal = kTokens * kAUnits
                    kAIters = (kATotal + kThreads - 1) // kThreads
                    kATokStep = kThreads // kAUnits
                    for tid in range(kThreads):
                        a_tok, a_unit = tid // kAUnits, tid % kAUnits
                        a_dst = kWBytes + a_tok * (KC * 2) + 16 * (a_unit ^ ((a_tok & 1) << 2))
                        for j in range(kAIters):
                            if not (kATotal % kThreads == 0 or tid + j * kThreads < kATotal):
                                continue
                            tok = a_tok + j * kATokStep
                            ok = tok < kTokens and tok0 + tok < M
                            dst = a_dst + j * kATokStep * (KC * 2)
                            if ok:
                                src = 2 * ((tok0 + tok) * K + chunk * KC + 8 * a_unit)
                                smem[dst:dst + 16] = a_bytes[src:src + 16]
                            else:
                                smem[dst:dst + 16] = 0
                    words_smem = smem.view(np.uint32)

                    def ld32(addr):
                        assert addr % 4 == 0
                        return int(words_smem[addr // 4])

                    # --- compute ---
                    for warp in range(kWarps):
                        warp_row = warp * 16 * TM
                        lanes = range(32)
                        g_of = lambda l: l >> 2
                        t_of = lambda l: l & 3
                        ld_off = {}
                        for l in lanes:
                            ld_row = warp_row + (l & 7)
                            for qq in range(kUnits // 4):
                                ld_off[(l, qq)] = ld_row * kRowBytes + 16 * ((4 * qq + (l >> 3)) ^ swizzle(KC, ld_row))
                        b_even = {l: kWBytes + g_of(l) * (KC * 2) + 16 * t_of(l) + 64 * (g_of(l) & 1) for l in lanes}
                        b_odd = {l: kWBytes + g_of(l) * (KC * 2) + 16 * t_of(l) - 64 * (g_of(l) & 1) for l in lanes}
                        s_off = {l: kWBytes + kABytes + (warp_row + g_of(l)) * kScaleBytes for l in lanes}
                        # scales words
                        sc = {}
                        for l in lanes:
                            for tm in range(TM):
                                for hf in range(2):
                                    addr = s_off[l] + (tm * 16 + hf * 8) * kScaleBytes
                                    for wi in range(kSpc // 2):
                                        sc[(l, tm, hf, wi)] = ld32(addr + 4 * wi)
                        # zero points for this chunk
                        zc = {}
                        for l in lanes:
                            for tm in range(TM):
                                for hf in range(2):
                                    n = row0 + warp_row + tm * 16 + hf * 8 + g_of(l)
                                    packed = 0
                                    if zp_packed and n < N:
                                        for byte in range(kSpc // 2):
                                            packed |= int(zp_flat[n * zp_row_bytes + chunk * (kSpc // 2) + byte]) << (8 * byte)
                                    zc[(l, tm, hf)] = packed
                        for qq in range(kUnits // 4):
                            # ldmatrix: words[l][tm][hf][i]
                            words = {}
                            for tm in range(TM):
                                for hf in range(2):
                                    addrs = {l: ld_off[(l, qq)] + (tm * 16 + hf * 8) * kRowBytes for l in lanes}
                                    for l in lanes:
                                        g, t = g_of(l), t_of(l)
                                        for i in range(4):
                                            words[(l, tm, hf, i)] = ld32(addrs[8 * i + g] + 4 * t)
                            for j in range(4):
                                unit = 4 * qq + j
                                upb = BS // 32
                                blk = unit // upb
                                block_end = (unit + 1) % upb == 0
                                bfrag = {}
                                for l in lanes:
                                    for nt in range(NT):
                                        addr = (b_odd[l] if unit & 1 else b_even[l]) + 64 * unit + nt * 8 * (KC * 2)
                                        v = [ld32(addr + 4 * i) for i in range(4)]
                                        bfrag[(l, nt)] = [prmt(v[0], v[2], 0x5410), prmt(v[0], v[2], 0x7632),
                                                          prmt(v[1], v[3], 0x5410), prmt(v[1], v[3], 0x7632)]
                                for tm in range(TM):
                                    # dequant: per lane pairs as numbers
                                    afr = {}
                                    for l in lanes:
                                        out = []
                                        for hf in range(2):
                                            wd = words[(l, tm, hf, j)]
                                            zz = ((zc[(l, tm, hf)] >> (4 * blk)) & 15) if zp_packed else 8
                                            nib = [(wd >> (4 * i)) & 15 for i in range(8)]
                                            out.append([(nib[0] - zz, nib[4] - zz), (nib[1] - zz, nib[5] - zz),
                                                        (nib[2] - zz, nib[6] - zz), (nib[3] - zz, nib[7] - zz)])
                                        lo, hi = out
                                        afr[l] = ([lo[0], hi[0], lo[1], hi[1]], [lo[2], hi[2], lo[3], hi[3]])
                                    for nt in range(NT):
                                        for step in range(2):
                                            # build A (16x16) and B (16x8) from fragments
                                            A = np.zeros((16, 16))
                                            B = np.zeros((16, 8))
                                            for l in lanes:
                                                g, t = g_of(l), t_of(l)
                                                regs = afr[l][step]
                                                A[g, 2 * t:2 * t + 2] = regs[0]
                                                A[g + 8, 2 * t:2 * t + 2] = regs[1]
                                                A[g, 2 * t + 8:2 * t + 10] = regs[2]
                                                A[g + 8, 2 * t + 8:2 * t + 10] = regs[3]
                                                breg = bfrag[(l, nt)][2 * step:2 * step + 2]
                                                h = lambda x: np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16).astype(np.float64)
                                                B[2 * t:2 * t + 2, g] = h(breg[0])
                                                B[2 * t + 8:2 * t + 10, g] = h(breg[1])
                                            D = A @ B
                                            for l in lanes:
                                                g, t = g_of(l), t_of(l)
                                                vals = [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]
                                                for i in range(4):
                                                    key = (warp, l, tm, nt, i)
                                                    part[key] = part.get(key, 0.0) + vals[i]
                                    if block_end:
                                        for l in lanes:
                                            def half_of(word, hsel):
                                                bits = (word >> 16) if hsel else (word & 0xFFFF)
                                                return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])
                                            s_lo = half_of(sc[(l, tm, 0, blk >> 1)], blk & 1)
                                            s_hi = half_of(sc[(l, tm, 1, blk >> 1)], blk & 1)
                                            for nt in range(NT):
                                                for i in range(4):
                                                    key = (warp, l, tm, nt, i)
                                                    s_ = s_lo if i < 2 else s_hi
                                                    acc[key] = acc.get(key, 0.0) + s_ * part.get(key, 0.0)
                                                    part[key] = 0.0
                # epilogue: red buffer
                kRedStride = kRows + 4
                red = np.full(kTokens * kRedStride, np.nan)
                for warp in range(kWarps):
                    warp_row = warp * 16 * TM
                    for l in range(32):
                        g, t = l >> 2, l & 3
                        for tm in range(TM):
                            for nt in range(NT):
                                r = warp_row + tm * 16 + g
                                tok = nt * 8 + 2 * t
                                get = lambda i: acc.get((warp, l, tm, nt, i), 0.0)
                                red[tok * kRedStride + r] = get(0)
                                red[(tok + 1) * kRedStride + r] = get(1)
                                red[tok * kRedStride + r + 8] = get(2)
                                red[(tok + 1) * kRedStride + r + 8] = get(3)
                reds.append(red)
            for split in range(splits):
                r_begin = split * kRows // splits
                r_count = (split + 1) * kRows // splits - r_begin
                for idx in range(r_count * kTokens):
                    tok = idx // r_count
                    r = r_begin + idx % r_count
                    n, m = row0 + r, tok0 + tok
                    if n >= N or m >= M:
                        continue
                    off = tok * kRedStride + r
                    y[m, n] = sum(reds[c][off] for c in range(splits))
    err = np.max(np.abs(y - ref)) / max(1e-9, np.max(np.abs(ref)))
    return err, np.isnan(y).sum()


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    cases = [
        # M, N, K, BS, KC, NT, TM, zp, splits
        (3, 130, 512, 32, 256, 1, 1, False, 1),
        (5, 128, 512, 32, 256, 1, 1, True, 2),
        (11, 70, 512, 32, 256, 2, 1, False, 1),
        (16, 129, 256, 64, 128, 2, 2, True, 2),
        (2, 64, 512, 128, 256, 1, 2, False, 2),
        (9, 40, 1024, 256, 512, 2, 1, True, 1),
        (4, 100, 384, 32, 128, 1, 2, True, 3),
        (1, 128, 256, 64, 256, 1, 1, False, 1),
    ]
    only = int(sys.argv[1]) if len(sys.argv) > 1 else None
    failed = 0
    for i, c in enumerate(cases):
        if only is not None and i != only:
            continue
        err, nans = emulate(*c, rng=rng)
        ok = err < 1e-12 and nans == 0
        failed += not ok
        print(c, "rel err", err, "unwritten", nans, "OK" if ok else "FAIL", flush=True)
    sys.exit(1 if failed else 0)
