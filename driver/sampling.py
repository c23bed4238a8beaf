"""Sampling: the warped distribution, one draw from it, and the speculative acceptance rule.

Every function takes `xp` (numpy on the CPU EP, CuPy on CUDA) and works on device arrays, so that on
CUDA the warping, the draws and the acceptance test run on the device, on the stream the forwards
run on; the uniforms come from a seeded generator on the same device (`Sampler.uniforms`). Nothing
here copies to the host: the caller's one copy per round (or per step) brings the token ids back.

    warp(logits, params, xp)               the target's (or the head's) distribution: temperature,
                                            then top-k, then top-p, as Hugging Face's warpers
    sample(probs, u, xp)                   one token drawn from probs with the uniform u
    accept_or_resample(p, q, drafts, ...)  speculative sampling's rule: how many drafts are kept
                                            (accepted_length) and the token after them, drawn from
                                            next_distribution: every token distributed as p

docs/driver.md#sampling has the guarantee and its proof sketch.
"""

from __future__ import annotations

import math
import operator
import secrets
from dataclasses import dataclass

import numpy as np

from .errors import DriverError

MAX_SEED = 2**64 - 1  # CuPy's cuRAND generator takes a uint64 seed


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy decoding (argmax; the other fields are then unused). top_k 0 and
    top_p 1.0 leave the distribution whole, as in Hugging Face's generate(), which then adds no
    warper. seed None: a fresh seed per generation (reported in the stats, so the run can be
    repeated)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def describe(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}


def check_sampling(temperature=0.0, top_k=0, top_p=1.0, seed=None) -> SamplingParams:
    """The knobs checked and normalised (ints and floats, numpy scalars accepted); a DriverError
    with one sentence for a bad value. top_k / top_p with temperature 0 are refused rather than
    ignored: greedy decoding would silently not apply them."""
    temperature = _real("temperature", temperature)
    if not (math.isfinite(temperature) and temperature >= 0):
        raise DriverError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    top_k = _integer("top-k", top_k)
    if top_k < 0:
        raise DriverError(f"top-k must be an integer >= 0 (0: off), got {top_k}")
    top_p = _real("top-p", top_p)
    if not 0 < top_p <= 1:  # NaN fails this too
        raise DriverError(f"top-p must be a number in (0, 1] (1: off), got {top_p!r}")
    if seed is not None:
        seed = _integer("seed", seed)
        if not 0 <= seed <= MAX_SEED:
            raise DriverError(f"seed must be an integer from 0 to 2**64-1, got {seed}")
    if temperature == 0 and (top_k != 0 or top_p != 1):
        raise DriverError("top-k and top-p apply only when sampling: give them with a temperature > 0 "
                          "(temperature 0 is greedy decoding)")
    return SamplingParams(temperature, top_k, top_p, seed)


def _real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DriverError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, value) -> int:
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        return operator.index(value)  # ints and numpy integers; not 1.5, not "3"
    except TypeError:
        raise DriverError(f"{name} must be an integer, got {value!r}") from None


# -- the math -------------------------------------------------------------------------------------


def warp(logits, params: SamplingParams, xp):
    """The distribution sampled from, over the last axis of `logits` (float32 probabilities, exactly
    0 for the tokens top-k / top-p remove). One function for the target and the head, so that the
    acceptance rule compares like with like.

    As transformers' TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper, in float32:
      temperature  logits / T. Computed as (logits - max) / T, which is the same distribution but
                   cannot overflow however small T is.
      top-k        keeps every token whose logit is >= the k-th largest (ties at the k-th are all
                   kept, as HF's `scores < topk_value` removes only smaller ones); k >= V keeps all.
      top-p        sorted ascending, removes the tokens whose cumulative probability is <= 1 - top_p,
                   never the most probable one: what is kept is the smallest set of most probable
                   tokens whose probability reaches top_p. On an exact tie at that boundary HF's set
                   depends on the order torch.sort leaves equal values in (not stable on CPU past ~100
                   entries); here every token tied with the last kept one is kept, a function of the
                   values alone (the same on CPU and CUDA).
    """
    x = logits.astype(xp.float32)
    x = (x - x.max(axis=-1, keepdims=True)) / xp.float32(params.temperature)
    if params.top_k or params.top_p < 1:
        x = xp.where(x < _cutoff(x, params.top_k, params.top_p, xp), xp.float32(-xp.inf), x)
    e = xp.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def _cutoff(x, top_k: int, top_p: float, xp):
    """The smallest logit top-k and top-p keep, per row ([..., 1]): both remove a prefix of the
    ascending sort, so one sort gives both, and the cut is a value (no scatter back to token order)."""
    s = xp.sort(x, axis=-1)  # ascending; the last entry is the row's max, 0
    vocab = s.shape[-1]
    # `removed`, the length of the removed prefix per row, is set by either branch (the caller comes
    # here only with top-k or top-p on)
    if top_k:
        kth = s[..., max(vocab - top_k, 0)][..., None]  # the k-th largest logit
        removed = (s < kth).sum(axis=-1)
        s = xp.where(s < kth, xp.float32(-xp.inf), s)  # what top-p sees: top-k's survivors
    if top_p < 1:
        e = xp.exp(s)
        cumulative = xp.cumsum(e / e.sum(axis=-1, keepdims=True), axis=-1)
        # cumulative is non-decreasing, so the tokens at or under 1 - top_p are a prefix; it holds the
        # top-k-removed ones (probability 0). The row's most probable token always stays.
        removed = xp.minimum((cumulative <= xp.float32(1 - top_p)).sum(axis=-1), vocab - 1)
    return xp.take_along_axis(s, removed[..., None], axis=-1)


def sample(probs, u, xp):
    """The token the uniform u in [0, 1) picks from `probs` (last axis; need not sum to 1): the first
    token whose cumulative mass exceeds u * total. A token of probability 0 is never picked (its
    cumulative mass equals its predecessor's). Returns a device integer (0-d, or one per row)."""
    cdf = xp.cumsum(probs, axis=-1, dtype=xp.float64)
    u = xp.asarray(u, dtype=xp.float64)
    token = (cdf <= (u * cdf[..., -1])[..., None]).sum(axis=-1)
    return xp.minimum(token, probs.shape[-1] - 1)  # only reached if every probability were 0


def accept_or_resample(p, q, drafts, u_accept, u_final, xp):
    """Speculative sampling's acceptance rule, on the device.

    p [k+1, V]: the target's warped distribution after [t, d_0 .. d_j-1] (verify row j);
    q [k, V]: the head's warped distribution d_j was drawn from; drafts [k]; u_accept [k] and u_final:
    uniforms in [0, 1). Draft d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)), in order,
    until the first rejection; at a rejection (row a) the token is drawn from max(0, p_a - q_a),
    normalised; after k acceptances it is drawn from p_k. Returns (a, token), device integers.
    """
    a = accepted_length(p, q, drafts, u_accept, xp)
    return a, sample(next_distribution(p, q, a, xp), u_final, xp)


def accepted_length(p, q, drafts, u_accept, xp):
    """How many drafts the rule keeps: d_j passes when u_j < p_j(d_j) / q_j(d_j), and the first one
    that fails ends the accepted prefix (a device integer, 0..k)."""
    rows = xp.arange(drafts.shape[0])
    p_draft, q_draft = p[rows, drafts], q[rows, drafts]
    # u < p/q, written without the division (q_draft > 0: d_j was drawn from q_j); p >= q always passes
    passed = (u_accept * q_draft < p_draft).astype(np.int64)
    return xp.cumprod(passed).sum()


def next_distribution(p, q, a, xp):
    """The (unnormalised) distribution of the token after `a` accepted drafts: max(0, p_a - q_a) at a
    rejection, p_k after all k were accepted (row k of q taken as 0, so it is the same formula)."""
    q_rows = xp.concatenate([q, xp.zeros_like(q[:1])])
    p_a = xp.take(p, a, axis=0)  # `a` stays on the device: a gather, not a host index
    residual = xp.maximum(p_a - xp.take(q_rows, a, axis=0), 0)
    # A rejection means p_a(d_a) < q_a(d_a), so the residual has mass; only float rounding of two
    # nearly equal distributions could leave it none, and p_a is then the right distribution anyway.
    return xp.where(residual.sum() > 0, residual, p_a)


# -- the generator of uniforms ------------------------------------------------------------------


class Sampler:
    """The knobs of one generation and its seeded source of uniforms, on the device of `xp`:
    numpy's Generator (PCG64) on CPU, CuPy's cuRAND generator on CUDA, which generates on CuPy's
    current stream (the shared stream while Generator.generate runs). The uniforms are generated
    in blocks of UNIFORM_BLOCK, so a round costs no generator call of its own most of the time; the
    sequence, and so the tokens, depend only on the seed and the order of the draws."""

    UNIFORM_BLOCK = 256

    def __init__(self, params: SamplingParams, xp):
        self.params = params
        self.xp = xp
        self.seed = secrets.randbits(64) if params.seed is None else params.seed
        if xp is np:
            self._random = np.random.default_rng(self.seed).random
        else:
            self._random = xp.random.RandomState(np.uint64(self.seed)).random_sample
        self._block = xp.zeros(0)  # the first uniforms() call generates the first block
        self._used = 0

    def uniforms(self, n: int):
        """The next n uniforms in [0, 1) (float64, on the device: a view of the current block)."""
        if self._used + n > self._block.shape[0]:
            self._block = self._random(max(n, self.UNIFORM_BLOCK))
            self._used = 0
        self._used += n
        return self._block[self._used - n:self._used]

    def warp(self, logits):
        return warp(logits, self.params, self.xp)

    def warp_rows(self, logits):
        """warp of each row of [R, V] logits, computed one row at a time: each row's distribution is
        then the one a draw from that row alone computes, and on CUDA each row's max and sum are
        CuPy's device-wide reductions, where a reduction over the last axis of R rows runs one
        thread block per row (CUB's segmented reduce)."""
        return self.xp.stack([self.warp(row) for row in logits])

    def draw(self, logits, keep: list | None = None):
        """A token drawn from the warped distribution of one row of logits (a device integer);
        `keep` collects that distribution (the head's q, which the acceptance rule needs)."""
        probs = self.warp(logits)
        if keep is not None:
            keep.append(probs)
        return sample(probs, self.uniforms(1)[0], self.xp)
