"""Python mirror of the tensor-core MatMulNBits kernel's work decomposition (PlanMma and StagesFor in
csrc/matmul_nbits/matmul_nbits_cuda.cu, the stage layout of MmaConfig in gemv_mma.cuh).

Used for the labels of bench/check_cuda_ops.py, by bench/emulate_gemv_mma.py, and to print the plan of
the benchmark shapes on a given device:

    python bench/gemv_plan.py                 # the 27B shapes on an H200 (132 SMs, 228 KB per SM)
    python bench/gemv_plan.py --sms 114 --smem-per-sm 233472

Keep it in step with the C++ (the device check labels each case with this plan; the emulation replays
the kernel's index arithmetic for it).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

MAX_WARPS = 8
MAX_STAGES = 12
BLOCKS_PER_SM = 2


@dataclass(frozen=True)
class Device:
    sms: int = 132                  # H200 / H100 SXM
    smem_per_sm: int = 233472       # cudaDevAttrMaxSharedMemoryPerMultiprocessor (228 KB)
    smem_per_block: int = 232448    # cudaDevAttrMaxSharedMemoryPerBlockOptin (227 KB)
    smem_reserved: int = 1024       # cudaDevAttrReservedSharedMemoryPerBlock
    cc_major: int = 9


H200 = Device()


@dataclass(frozen=True)
class Plan:
    kc: int
    splits: int
    rows_per_block: int
    row_blocks: int
    warps: int


def chunk_size(K: int, block: int) -> int:
    """k-values per stage, 0 when the tensor-core kernel does not take K."""
    if block <= 64:
        return 256 if K % 256 == 0 else 128 if K % 128 == 0 else 0
    return 2 * block if K % (2 * block) == 0 else 0


def plan(N: int, K: int, block: int, dev: Device = H200) -> Plan | None:
    """PlanMma for fp16/bf16, 4 bits, no or packed zero points, aligned buffers (else None)."""
    if block not in (32, 64, 128, 256) or dev.cc_major < 8:
        return None
    kc = chunk_size(K, block)
    if not kc:
        return None
    kchunks = K // kc
    slots = BLOCKS_PER_SM * dev.sms
    best = None  # (splits, rows, warps)
    s = 1
    while s <= 8:
        if s > 1 and (dev.cc_major < 9 or kchunks < 2 * s):
            break
        ranges = max(1, slots // s)
        rows = max(16, -(-N // ranges))
        warps = -(-rows // 16)
        if warps > MAX_WARPS:
            break
        best = (s, rows, warps)
        s *= 2
    if best is None:
        wave_rows = 16 * MAX_WARPS * slots
        ranges = slots * -(-N // wave_rows)
        rows = -(-N // ranges)
        best = (1, rows, -(-rows // 16))
    s, rows, warps = best
    return Plan(kc=kc, splits=s, rows_per_block=rows, row_blocks=-(-N // rows), warps=warps)


def stage_bytes(p: Plan, block: int, tokens: int) -> int:
    """MmaConfig::StageBytes: weights, activations, scales of one chunk."""
    rows = 16 * p.warps
    return rows * p.kc // 2 + tokens * p.kc * 2 + rows * 2 * (p.kc // block)


def red_bytes(p: Plan, tokens: int) -> int:
    return tokens * (16 * p.warps + 4) * 4


def stages(p: Plan, K: int, block: int, tokens: int, dev: Device = H200, max_stages: int = 0) -> int:
    """StagesFor: pipeline depth of the 8-token (M <= 8) or 16-token kernel; 0 if it does not fit."""
    sb, rb = stage_bytes(p, block, tokens), red_bytes(p, tokens)
    for per_sm in range(BLOCKS_PER_SM, 0, -1):
        budget = min(dev.smem_per_block, dev.smem_per_sm // per_sm - dev.smem_reserved)
        n = min(budget // sb, MAX_STAGES)
        n = min(n, -(-(K // p.kc) // p.splits) + 1)
        if max_stages:
            n = min(n, max_stages)
        while n >= 2 and n * sb < rb:
            n += 1
        if n >= 2 and n * sb <= budget:
            return n
    return 0


def describe(N: int, K: int, block: int = 32, dev: Device = H200) -> str:
    p = plan(N, K, block, dev)
    if p is None:
        return f"N={N} K={K} block={block}: not the tensor-core kernel"
    blocks = p.row_blocks * p.splits
    s8, s16 = stages(p, K, block, 8, dev), stages(p, K, block, 16, dev)
    in_flight = (s8 - 1) * min(p.rows_per_block, N) * p.kc // 2
    return (f"N={N:>6} K={K:>5}: splits {p.splits}, {p.row_blocks} ranges of {p.rows_per_block} rows, "
            f"{p.warps} warps, {blocks} blocks ({blocks / (BLOCKS_PER_SM * dev.sms):.2f} of 2/SM), "
            f"{K // p.kc // p.splits}+ chunks per slice, stages {s8} (M<=8) / {s16} (M 9..16), "
            f"{in_flight / 1024:.0f} KB of weights in flight per block at M<=8")


SHAPES_27B = [("chain/gate_up 5120->17408", 17408, 5120), ("chain/down 17408->5120", 5120, 17408),
              ("q_proj 5120->12288", 12288, 5120), ("k/v_proj 5120->1024", 1024, 5120),
              ("o_proj 6144->5120", 5120, 6144), ("in_proj_qkv 5120->10240", 10240, 5120),
              ("in_proj_z 5120->6144", 6144, 5120), ("lm_head 5120->248320", 248320, 5120)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=H200.sms)
    ap.add_argument("--smem-per-sm", type=int, default=H200.smem_per_sm)
    ap.add_argument("--block", type=int, default=32)
    args = ap.parse_args(argv)
    if args.sms < 1 or args.smem_per_sm < 1024 or args.block not in (32, 64, 128, 256):
        ap.error("--sms >= 1, --smem-per-sm >= 1024, --block one of 32, 64, 128, 256")
    dev = Device(sms=args.sms, smem_per_sm=args.smem_per_sm,
                 smem_per_block=min(H200.smem_per_block, args.smem_per_sm - 1024))
    for label, N, K in SHAPES_27B:
        print(f"{label:<26} {describe(N, K, args.block, dev)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
