"""Python mirror of the tensor-core MatMulNBits kernel's work decomposition: gemv::CutStream and
StreamConfig's per-warp ring (csrc/matmul_nbits/gemv_stream.cuh) with PlanStream's constants and
StreamChunk (matmul_nbits_cuda.cu). For the labels of bench/check_cuda_ops.py, and to print the cut
of the benchmark shapes:

    python bench/gemv_plan.py                 # the 27B shapes on an H200 (132 SMs)
    python bench/gemv_plan.py --sms 114 --resident 6

The C++ also lowers the K-parts while the grid would need a second wave; how many blocks fit on an SM
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
    blocks: int

    @property
    def warps(self) -> int:
        return self.tiles * self.kparts


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
    kp = max(1, min(sms * WARPS_PER_SM // tiles_total, max(1, min(MAX_WARPS, kchunks // 2))))
    while True:
        tiles = min(max(1, MIN_BLOCK_WARPS // kp), max(1, MAX_WARPS // kp))
        warps = tiles * kp
        per_sm = max(1, resident_blocks_of_4 * 4 // warps)  # registers allow ~24 warps per SM
        blocks = -(-tiles_total // tiles)
        if blocks <= sms * per_sm or kp == 1 or tiles_total >= 4 * sms * MAX_WARPS:
            return Plan(kc, tiles, kp, blocks)
        kp -= 1


def describe(N: int, K: int, block: int = 32, sms: int = 132, resident: int = 6) -> str:
    p = plan(N, K, block, sms, resident)
    if p is None:
        return f"{N} x {K}, block {block}: not taken by the tensor-core kernel"
    return (f"{N} x {K}, block {block}: kc {p.kc}, {p.kparts} K-parts x {p.tiles} m-tiles = {p.warps} warps per "
            f"block, {p.blocks} blocks, {warp_bytes(p.kc, block) * p.warps} B of shared memory per block")


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
