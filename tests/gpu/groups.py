"""The GPU check groups: what each covers and the kernel-selection environment it runs under.

A group is the unit of fault isolation: each runs in its own process (worker.py), because a kernel
that faults leaves a CUDA context in which every later call fails, and because the library reads
ORT_MTP_GEMV_VARIANT / ORT_MTP_GEMV_PDL once per process. The smoke groups are one per kernel path,
small enough for compute-sanitizer, so that a fault names its path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterable

import cases_copy_slots
import cases_float_matmul
import cases_gated_attention
import cases_fuzz
import cases_gated_delta_net
import cases_group_query_attention
import cases_matmul
import cases_skip_norm
from cases_matmul import SMOKE_CASES, check_decode_consistency, check_graph, check_matmul, check_pair, check_smoke
from harness import Context


@dataclass(frozen=True)
class Group:
    name: str
    what: str
    run: Callable[[Context], Iterable[dict]]  # yields one record per case
    env: dict = field(default_factory=dict)   # set in the group's process (others of ENV_KEYS unset)


MATMUL = [
    Group("smoke-mma", "tensor-core kernel, one K-part: fp16/bf16 x block 32/64/128/256 x zero points "
          "none/packed x 8/16 tokens, KC 128/256/512, 1-4 m-tiles per block",
          partial(check_smoke, cases=SMOKE_CASES["mma"])),
    Group("smoke-mma-kparts", "tensor-core kernel split over K into 2..16 K-parts (warps of one block)",
          partial(check_smoke, cases=SMOKE_CASES["mma-kparts"])),
    Group("smoke-mma-wide", "tensor-core kernel on layer-like cuts: many blocks, several waves, K-parts x m-tiles",
          partial(check_smoke, cases=SMOKE_CASES["mma-wide"])),
    Group("smoke-generic", "general kernel: fp32, 8 bits, typed zero points, block 16, K % block != 0",
          partial(check_smoke, cases=SMOKE_CASES["generic"])),
    Group("smoke-tiles", "tiles kernel (packing=1, weights packed by ops.packing): fp16/bf16 x block 32/64/128, "
          "K-parts, waves, two-shape cuts", partial(check_smoke, cases=SMOKE_CASES["tiles"], tiles=True)),
    Group("matmul", "fixed coverage list + random cases vs the float64 reference and our CPU op", check_matmul),
    Group("pair", "two weight sets on one A (the swiglu MLP form and two outputs; tiles, stream and general "
          "kernels) against one-weight nodes, rows bit-identical across M", check_pair),
    Group("decode", "rows bit-identical across M = 1..16, 17, 24, 33, 40 (default kernels)", check_decode_consistency),
    Group("graph", "capture and replay under ORT's CUDA graph (PDL launches, the default), new data into "
          "bound buffers", check_graph),
]

# Kernel paths chosen by an environment switch, each in its own group: a group goes with its path.
PLAIN_LAUNCHES = [  # ORT_MTP_GEMV_PDL=0: without programmatic dependent launch
    Group("smoke-plain", "tensor-core kernel without programmatic dependent launch (ORT_MTP_GEMV_PDL=0)",
          partial(check_smoke, cases=SMOKE_CASES["plain"]), {"ORT_MTP_GEMV_PDL": "0"}),
    Group("graph-plain", "CUDA graph capture and replay with plain launches and copies (ORT_MTP_GEMV_PDL=0)",
          check_graph, {"ORT_MTP_GEMV_PDL": "0"}),
]
COPY_SLOTS = [
    Group("copy_slots", "CopySlots: promote in place, slot and whole copies, 150 tensors, CUDA graph",
          cases_copy_slots.check_copy_slots),
]

GATED_DELTA_NET = [
    Group("gated-delta-net", "GatedDeltaNet: CUDA against our CPU op (27B-class layer, presets, random shapes, "
          "fp16/bf16/fp32, windows), width S bit-identical to S width-1 calls, in place, CUDA graph",
          cases_gated_delta_net.check_gated_delta_net),
    # The state columns per block are a speed knob only (a column's arithmetic is the same in any block):
    # the other extremes of ORT_MTP_GDN_COLS pass the same checks.
    *(Group(f"gated-delta-net-cols{cols}", f"GatedDeltaNet as gated-delta-net, {cols} state columns per block",
            cases_gated_delta_net.check_gated_delta_net, {"ORT_MTP_GDN_COLS": str(cols)}) for cols in (8, 128)),
]

# The CUDA kernel is registered by default (ORT_MTP_GQA_CUDA=0 would leave it out: see the .cc).
GROUP_QUERY_ATTENTION = [
    Group("group-query-attention", "GroupQueryAttention: CUDA against our CPU op (27B-class layer, presets, "
          "windows, softcap, random shapes, fp16/bf16/fp32), width S bit-identical to S width-1 calls, shared "
          "buffer, bad seqlens_k", cases_group_query_attention.check_group_query_attention),
]

GATED_ATTENTION = [
    Group("gated-attention", "GatedAttention: CUDA against our CPU op (27B-class layer at S = 1, 5, 16 and a "
          "prompt, the presets' shapes, fp16/bf16/fp32, both MRoPE layouts), width S bit-identical to S width-1 "
          "calls, a bad position", cases_gated_attention.check_gated_attention),
]

FLOAT_MATMUL = [
    Group("float-matmul", "MatMul (a/b projections): CUDA against our CPU op (27B-class K=5120 N=48 at M=1..16 "
          "and 2048, odd N and K, fp16/bf16/fp32, random shapes), rows bit-identical to 1-row calls, CUDA graph",
          cases_float_matmul.check_float_matmul),
]

SKIP_NORM = [
    Group("skip-norm", "SkipSimplifiedLayerNormalization: CUDA against our CPU op (27B-class H=5120 at M=1..5 and "
          "2048, bf16 with bias, fp32 odd H, H=1, the largest H), rows bit-identical to 1-row calls, CUDA graph",
          cases_skip_norm.check_skip_norm, {"ORT_MTP_SKIP_NORM_CUDA": "1"}),  # registered on request only (measured slower)
]

OP_FUZZ = [
    Group(f"op-fuzz-seed{seed}", f"tests/op_fuzz.py's {cases_fuzz.CASES} random cases of seed {seed} for both ops: "
          "exact or ONNX Runtime's error, never a crash", partial(cases_fuzz.check_op_fuzz, seed=seed))
    for seed in cases_fuzz.SEEDS
]

GROUPS = {g.name: g for g in MATMUL + PLAIN_LAUNCHES + COPY_SLOTS + GATED_DELTA_NET + GROUP_QUERY_ATTENTION
          + GATED_ATTENTION + FLOAT_MATMUL + SKIP_NORM
          + OP_FUZZ}
