"""Python mirror of the tensor-core MatMulNBits kernel's work decomposition: gemv::CutStream and
StreamConfig's per-warp ring (csrc/matmul_nbits/gemv_stream.cuh) with PlanStream's constants and
StreamChunk (matmul_nbits_cuda.cu). For the labels of bench/check_cuda_ops.py, and to print the cut
of the benchmark shapes:

    python bench/gemv_plan.py                 # the 27B shapes on an H200 (132 SMs)
    python bench/gemv_plan.py --sms 114 --resident 6

The C++ also lowers the K-parts while the grid would need a second wave, and may cut a one-wave grid
into blocks of two shapes (kparts + 1 and kparts K-parts); how many blocks fit on an SM
depends on the compiled kernel's registers (cudaOccupancyMaxActiveBlocksPerMultiprocessor), which this
mirror takes as a parameter (`resident`, blocks of 4 warps; 6 for the fp16 block-32 kernel built with
nvcc 13.0, 78 registers).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

MAX_WARPS = 16
WARPS_PER_SM = 24
MIN_BLOCK_WARPS = 4
STAGES = 3


@dataclass(frozen=True)
class Plan:
    kc: int
    tiles: int           # m-tiles (16 rows) per block
    kparts: int          # K-parts per m-tile
    blocks: int          # all blocks, the alt blocks included
    alt_tiles: int = 0   # the first alt_blocks blocks: alt_tiles m-tiles x alt_kparts K-parts
    alt_kparts: int = 1
    alt_blocks: int = 0

    @property
    def warps(self) -> int:
        return self.tiles * self.kparts


def most_tiles_per_sm(p: Plan, sms: int) -> int:
    """MostTilesPerSm: m-tiles on the most loaded SM, blocks dealt to the SMs in index order."""
    most = 0
    for s in range(min(sms, p.blocks)):
        blocks = (p.blocks - s + sms - 1) // sms
        alt = (p.alt_blocks - s + sms - 1) // sms if p.alt_blocks > s else 0
        most = max(most, alt * p.alt_tiles + (blocks - alt) * p.tiles)
    return most


def chunk_size(K: int, block: int) -> int:
    """StreamChunk: k-values per stage, or 0 if the tensor-core kernel does not take the problem."""
    if block in (32, 64):
        return 256 if K % 256 == 0 else (128 if K % 128 == 0 else 0)
    if block == 128:
        return 256 if K % 256 == 0 else 0
    if block == 256:
        return 512 if K % 512 == 0 else 0
    return 0


def warp_bytes(kc: int, block: int) -> int:
    """Shared memory of one warp's ring: STAGES x (16 rows x kc/2 bytes + 16 rows' scales)."""
    return STAGES * (16 * kc // 2 + 16 * 2 * (kc // block))


def plan(N: int, K: int, block: int, sms: int = 132, resident_blocks_of_4: int = 6) -> Plan | None:
    kc = chunk_size(K, block)
    if kc == 0:
        return None
    tiles_total = -(-N // 16)
    kchunks = K // kc
    most = max(1, min(MAX_WARPS, kchunks // 2))
    kp = max(1, min(sms * WARPS_PER_SM // tiles_total, most))

    def per_sm(warps: int) -> int:
        return max(1, resident_blocks_of_4 * 4 // warps)  # registers allow ~24 warps per SM

    while True:
        tiles = min(max(1, MIN_BLOCK_WARPS // kp), max(1, MAX_WARPS // kp))
        blocks = -(-tiles_total // tiles)
        one_wave = blocks <= sms * per_sm(tiles * kp)
        if one_wave or kp == 1 or tiles_total >= 4 * sms * MAX_WARPS:
            break
        kp -= 1
    cut = Plan(kc, tiles, kp, blocks)
    if not one_wave or kp + 1 > most:
        return cut
    # Two shapes: W warps per block, most blocks with kp + 1 K-parts, the first alt blocks with kp.
    ka, kb = kp + 1, kp
    best = most_tiles_per_sm(cut, sms)
    for w in range(ka * kb, MAX_WARPS + 1, ka * kb):
        if w < MIN_BLOCK_WARPS:
            continue
        slots = sms * per_sm(w)
        ta, tb = w // ka, w // kb
        alt = max(0, -(-(tiles_total - ta * slots) // (tb - ta)))
        main = max(0, -(-(tiles_total - tb * alt) // ta))
        if alt == 0 or main + alt > slots:
            continue
        two = Plan(kc, ta, ka, main + alt, tb, kb, alt)
        load = most_tiles_per_sm(two, sms)
        if load < best:
            best, cut = load, two
    return cut


def describe(N: int, K: int, block: int = 32, sms: int = 132, resident: int = 6) -> str:
    p = plan(N, K, block, sms, resident)
    if p is None:
        return f"{N} x {K}, block {block}: not taken by the tensor-core kernel"
    alt = (f" ({p.alt_blocks} of them {p.alt_kparts} K-parts x {p.alt_tiles} m-tiles)" if p.alt_blocks else "")
    return (f"{N} x {K}, block {block}: kc {p.kc}, {p.kparts} K-parts x {p.tiles} m-tiles = {p.warps} warps per "
            f"block, {p.blocks} blocks{alt}, {warp_bytes(p.kc, block) * p.warps} B of shared memory per block")


SHAPES_27B = [(17408, 5120), (5120, 17408), (12288, 5120), (1024, 5120), (5120, 6144), (10240, 5120),
              (6144, 5120), (248320, 5120)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--resident", type=int, default=6, help="blocks of 4 warps that fit on an SM")
    args = ap.parse_args(argv)
    for N, K in SHAPES_27B:
        print(describe(N, K, args.block, args.sms, args.resident))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
