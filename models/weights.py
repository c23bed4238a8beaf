"""Synthetic weights: random, but with an MTP head that genuinely predicts the target's next token.

The construction (measured on a 4B-class checkpoint before this project; docs/models.md#the-weights):
- every output projection (attention o_proj, MLP down_proj, linear-attention out_proj) is drawn
  with std out_scale/sqrt(fan_in) (out_scale 0.02), so the residual stream stays close to the
  token embedding and the target's next token is mostly a function of the current token;
- the MTP head's fc is [identity | random, std mtp_noise/sqrt(H)]: it passes the (normed) embedding of the
  token it is given straight into its layer, so it predicts what the target will say after that
  token; the random half adds a deterministic perturbation whose size is the knob;
- every other random path is drawn with std 1/sqrt(fan_in): at large hidden sizes and a 248k
  vocabulary anything larger drowns the identity path (N(0, 0.02) at H=2560 gave 1-6% acceptance on that checkpoint).
- the lm_head rows of the special tokens are zero, so their logit is exactly 0 while the largest
  random logit is ~4 sigma: greedy decoding never emits EOS and benchmarks run to their length.

Every matrix that the builder quantizes is *defined* as int4 blocks (symmetric nibbles -7..7 around
the MatMulNBits zero point 8, one fp16-representable scale per 32 values): int4 builds store them
as is, fp16/fp32 builds store their exact dequantization, so one seed gives the same function at
every precision. Float tensors are fp16-representable for the same reason. Each tensor is drawn
from its own counter-based stream keyed by (seed, tensor name, chunk), so a 27B build can draw
chunks in parallel threads and any tensor can be regenerated alone.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

# A nibble is drawn uniform on 0..15 and then 0 (value -8) is replaced by 8 (value 0): values -7..7,
# 0 twice as likely, mean exactly 0, variance (2 * sum_{v=1..7} v^2) / 16 = 17.5.
NIBBLE_STD = math.sqrt(17.5)
ZERO_NIBBLES = 0x88  # two nibbles at the zero point: a byte of int4 zeros
_CHUNK_BYTES = 8 << 20  # packed bytes per generated chunk: big enough for numpy, small for threads
_NIBBLE_LOW_BITS = np.uint64(0x1111111111111111)


def _stream(seed: int, name: str, chunk: int) -> np.random.Generator:
    """Independent random stream for one chunk of one tensor (SFC64: fast and counter-seeded)."""
    digest = hashlib.blake2b(name.encode(), digest_size=16).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, chunk, *words])))


def as_fp16_values(x: np.ndarray, dtype) -> np.ndarray:
    """float32 values -> fp16-representable values stored as `dtype` (float16 or float32).
    numpy's float16 casts are slow scalar loops (~100-150 M values/s), so cast as few times as
    possible: once for an fp16 tensor, twice for an fp32 one."""
    half = x.astype(np.float16)
    return half if np.dtype(dtype) == np.float16 else half.astype(dtype)


def _symmetric_nibbles(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """`nbytes` random bytes; each nibble uniform on 0..15 except that 0 was replaced by 8."""
    words = rng.integers(0, np.iinfo(np.uint64).max, size=(nbytes + 7) // 8, dtype=np.uint64, endpoint=True)
    # SWAR: bit 0 of `nonzero` is set in every nonzero nibble; zero nibbles get bit 3 (value 8).
    nonzero = words >> np.uint64(1)
    nonzero |= words
    nonzero |= nonzero >> np.uint64(2)
    nonzero &= _NIBBLE_LOW_BITS
    np.bitwise_xor(nonzero, _NIBBLE_LOW_BITS, out=nonzero)  # now: bit 0 set in every zero nibble
    nonzero <<= np.uint64(3)
    words |= nonzero
    return words.view(np.uint8)[:nbytes]


# ----------------------------------------------------------------------------------------------
# int4 matrices (MatMulNBits layout: B [N, K/block, block/2] uint8, scales [N, K/block])
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Int4Matrix:
    """A weight of shape [N, K] (out x in, like torch Linear) defined as symmetric int4 blocks.

    std: target standard deviation of the dequantized values. zero_rows: output rows that are
    all zero. identity_half: the MTP fc [H, 2H] = [identity | random(std)]."""

    n: int
    k: int
    std: float
    block: int = 32
    zero_rows: tuple[int, ...] = ()
    identity_half: bool = False

    @property
    def blocks(self) -> int:
        return self.k // self.block

    @property
    def rows_per_chunk(self) -> int:
        return max(1, _CHUNK_BYTES // (self.k // 2))

    def chunk_ranges(self) -> list[tuple[int, int]]:
        step = self.rows_per_chunk
        return [(r, min(r + step, self.n)) for r in range(0, self.n, step)]

    def chunk(self, seed: int, name: str, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of chunk `index`: (packed uint8 [rows, blocks, block/2], scales float16 [rows, blocks])."""
        start, stop = self.chunk_ranges()[index]
        rows, half = stop - start, self.block // 2
        rng = _stream(seed, name, index)
        packed = _symmetric_nibbles(rng, rows * self.blocks * half).reshape(rows, self.blocks, half)
        jitter = rng.random(size=(rows, self.blocks), dtype=np.float32)
        jitter *= np.float32(0.5 * self.std / NIBBLE_STD)
        jitter += np.float32(0.75 * self.std / NIBBLE_STD)  # scale ~ U(0.75, 1.25) * std / NIBBLE_STD
        scales = jitter.astype(np.float16)
        if self.identity_half:
            self._write_identity(packed, scales, start, stop)
        for row in self.zero_rows:
            if start <= row < stop:
                packed[row - start] = ZERO_NIBBLES
        return packed, scales

    def _write_identity(self, packed: np.ndarray, scales: np.ndarray, start: int, stop: int) -> None:
        """First K/2 columns = identity: nibble 15 (value +7) with scale 1/7 on the diagonal."""
        id_blocks = (self.k // 2) // self.block
        packed[:, :id_blocks] = ZERO_NIBBLES
        scales[:, :id_blocks] = np.float16(1.0 / 7.0)
        rows = np.arange(start, stop)
        byte = (rows % self.block) // 2
        packed[rows - start, rows // self.block, byte] = np.where(rows % 2 == 0, 0x8F, 0xF8)


def dequantize(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[N, blocks, block/2] uint8 + [N, blocks] scales -> [N, K] float32 (MatMulNBits semantics)."""
    n, blocks, half = packed.shape
    values = np.empty((n, blocks, 2 * half), np.float32)
    values[..., 0::2] = (packed & 0x0F).astype(np.float32) - 8.0
    values[..., 1::2] = (packed >> 4).astype(np.float32) - 8.0
    values *= scales.astype(np.float32).reshape(n, blocks, 1)
    return values.reshape(n, blocks * 2 * half)


# ----------------------------------------------------------------------------------------------
# float tensors
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Normal:
    """fp16-representable N(mean, std) tensor, drawn in row chunks."""

    shape: tuple[int, ...]
    std: float
    mean: float = 0.0

    @property
    def row_size(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    def chunk_ranges(self) -> list[tuple[int, int]]:
        rows = self.shape[0]
        step = max(1, (4 << 20) // self.row_size)
        return [(r, min(r + step, rows)) for r in range(0, rows, step)]

    def chunk(self, seed: int, name: str, index: int, dtype=np.float32) -> np.ndarray:
        start, stop = self.chunk_ranges()[index]
        rng = _stream(seed, name, index)
        values = rng.standard_normal((stop - start, *self.shape[1:]), dtype=np.float32)
        values *= np.float32(self.std)
        values += np.float32(self.mean)
        return as_fp16_values(values, dtype)


@dataclass(frozen=True)
class Uniform:
    """fp16-representable U(low, high) tensor (small tensors only: one chunk)."""

    shape: tuple[int, ...]
    low: float
    high: float

    def chunk_ranges(self) -> list[tuple[int, int]]:
        return [(0, self.shape[0])]

    def chunk(self, seed: int, name: str, index: int, dtype=np.float32) -> np.ndarray:
        rng = _stream(seed, name, index)
        return as_fp16_values(rng.uniform(self.low, self.high, size=self.shape).astype(np.float32), dtype)


# ----------------------------------------------------------------------------------------------
# parallel, ordered chunk generation
# ----------------------------------------------------------------------------------------------


def workers() -> int:
    return max(1, min(32, os.cpu_count() or 1))


def ordered_map(fn: Callable[[int], object], count: int, pool: ThreadPoolExecutor | None) -> Iterator:
    """fn(0..count-1) in order, computed ahead by the pool with a bounded number in flight (so a
    2.5 GB tensor is never whole in memory); numpy releases the GIL in the heavy parts."""
    if pool is None or count == 1:
        for i in range(count):
            yield fn(i)
        return
    window = 2 * workers()
    pending: deque = deque()
    submitted = 0
    while submitted < count and len(pending) < window:
        pending.append(pool.submit(fn, submitted))
        submitted += 1
    while pending:
        result = pending.popleft().result()
        if submitted < count:
            pending.append(pool.submit(fn, submitted))
            submitted += 1
        yield result


def float_chunks(spec: Normal | Uniform, seed: int, name: str, np_dtype, pool) -> Iterable[np.ndarray]:
    count = len(spec.chunk_ranges())
    return ordered_map(lambda i: spec.chunk(seed, name, i, np_dtype), count, pool)
