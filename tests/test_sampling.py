"""Sampling (driver/sampling.py and the sampled paths of driver/generator.py), on the CPU EP.

- warp against transformers' TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper;
- sample: the set of uniforms that picks each token has exactly that token's probability;
- the acceptance rule alone, on small synthetic p and q: the distribution of a round's tokens
  computed exactly by enumerating its branches equals the target's, and a seeded Monte Carlo run
  agrees within a tolerance derived from its count;
- end to end: the first two tokens of plain sampling and of MTP sampling (k = 1 and 3) over many
  seeds, against the exact distribution computed from the model's logits and against each other,
  and two deliberately wrong acceptance rules failing the same test;
- reproducibility, temperature 0 == greedy, stats, and one-line errors for bad values.

Every random draw here is seeded: the tests are deterministic, and the significance levels say how
unlikely a failure of a correct implementation would have been for the seeds chosen.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from itertools import product

import numpy as np
import pytest

import driver.generator
from driver import DriverError, Generator
from driver.sampling import (SamplingParams, accept_or_resample, accepted_length, check_sampling, next_distribution,
                             sample, warp)

# -- warp against transformers ---------------------------------------------------------------------

WARPS = [  # (temperature, top_k, top_p)
    (0.7, 0, 1.0), (1.0, 8, 1.0), (1.3, 0, 0.5), (0.7, 50, 0.9), (0.5, 0, 0.01), (2.0, 2000, 0.95),
    (1.0, 1, 1.0), (0.9, 3, 0.999),
]


def hf_warp(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The probabilities transformers' generate() samples from: the warpers it adds for these values
    (none for temperature 1, top_k 0, top_p 1), in its order, then softmax."""
    torch = pytest.importorskip("torch", reason="torch is not installed: no reference for the warping")
    lp = pytest.importorskip("transformers.generation.logits_process",
                             reason="transformers is not installed: no reference for the warping")
    scores = torch.from_numpy(logits)
    if temperature != 1.0:
        scores = lp.TemperatureLogitsWarper(float(temperature))(None, scores)
    if top_k:
        scores = lp.TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = lp.TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, dim=-1).numpy()


def near_top_p_boundary(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Rows whose top-p cut is within float32 rounding of a cumulative probability (computed in
    float64 here): there either answer is right, and the two float32 computations may differ."""
    if top_p == 1.0:
        return np.zeros(len(logits), bool)
    x = np.sort(logits.astype(np.float64) / temperature, axis=-1)
    if top_k:
        x = np.where(x < x[:, max(x.shape[1] - top_k, 0)][:, None], -np.inf, x)
    e = np.exp(x - x[:, -1:])
    cumulative = np.cumsum(e / e.sum(axis=-1, keepdims=True), axis=-1)
    return (np.abs(cumulative - (1 - top_p)) < 1e-5).any(axis=-1)


@pytest.mark.parametrize("temperature, top_k, top_p", WARPS)
def test_warp_matches_transformers(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((64, 1000)) * 3).astype(np.float32)
    ours = warp(logits, SamplingParams(temperature, top_k, top_p), np)
    ref = hf_warp(logits, temperature, top_k, top_p)
    rows = ~near_top_p_boundary(logits, temperature, top_k, top_p)
    assert rows.sum() >= 60
    np.testing.assert_array_equal(ours[rows] > 0, ref[rows] > 0)  # the same tokens kept
    np.testing.assert_allclose(ours[rows], ref[rows], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ours.sum(axis=-1), 1, rtol=1e-5)
    # the head warps one row at a time, the verify k+1 rows at once: the same numbers either way
    for i in range(4):
        np.testing.assert_array_equal(warp(logits[i], SamplingParams(temperature, top_k, top_p), np), ours[i])


@pytest.mark.parametrize("top_k", [1, 5, 40])
def test_top_k_keeps_every_tie_at_the_kth_logit_as_transformers(top_k):
    """Logits on a grid of 0.5: many ties, some at the k-th largest value; transformers removes only
    the logits below it, and so does warp."""
    rng = np.random.default_rng(1)
    logits = (np.round(rng.standard_normal((32, 200)) * 4) / 2).astype(np.float32)
    ours = warp(logits, SamplingParams(1.0, top_k, 1.0), np)
    ref = hf_warp(logits, 1.0, top_k, 1.0)
    np.testing.assert_array_equal(ours > 0, ref > 0)
    assert ((ours > 0).sum(axis=-1) > top_k).any()  # the test has ties at the boundary to look at


def test_top_p_ties_at_the_boundary_are_all_kept():
    """Where tokens tie at the top-p cut, transformers keeps some of them, which ones depending on
    the order torch.sort leaves equal values in; warp keeps all of them (docs/driver.md#sampling).
    Everywhere else the kept sets are the same."""
    rng = np.random.default_rng(2)
    logits = (np.round(rng.standard_normal((64, 300)) * 3) / 2).astype(np.float32)
    ours = warp(logits, SamplingParams(1.0, 0, 0.8), np) > 0
    ref = hf_warp(logits, 1.0, 0, 0.8) > 0
    assert not (ref & ~ours).any()  # warp keeps everything transformers keeps
    extra = ours & ~ref
    smallest_kept = np.where(ref, logits, np.inf).min(axis=-1)
    assert (logits[extra] == np.broadcast_to(smallest_kept[:, None], logits.shape)[extra]).all()
    assert extra.any()  # ties at the boundary did occur


def test_warp_cannot_overflow_at_a_tiny_temperature():
    logits = np.array([[3.0, 1.0, 3.5, -2.0], [0.0, 0.0, -1.0, 5.0]], np.float32)
    probs = warp(logits, SamplingParams(1e-30, 0, 1.0), np)
    np.testing.assert_array_equal(probs, [[0, 0, 1, 0], [0, 0, 0, 1]])


# -- sample ----------------------------------------------------------------------------------------


def test_sample_maps_each_tokens_share_of_the_unit_interval_to_it():
    """sample(probs, u) returns token i exactly for u in [c_i-1, c_i) (c: the cumulative share of the
    mass): checked at both ends of every interval, so the probability of i is p_i and a token of
    probability 0 (an empty interval) is never returned. Unnormalised input is normalised."""
    probs = np.array([0.0, 0.3, 0.0, 0.2, 0.5, 0.0], np.float32) * 2
    cdf = np.cumsum(probs.astype(np.float64)) / probs.sum(dtype=np.float64)
    for i in np.flatnonzero(probs):
        low = cdf[i - 1] if i else 0.0
        assert sample(probs, low, np) == i
        assert sample(probs, np.nextafter(cdf[i], 0), np) == i
    rows = np.stack([probs, probs[::-1]])
    np.testing.assert_array_equal(sample(rows, np.array([0.0, 0.0]), np), [1, 1])
    np.testing.assert_array_equal(sample(rows, np.array([0.999999, 0.999999]), np), [4, 4])


# -- the acceptance rule alone ---------------------------------------------------------------------

VOCAB = 3


def synthetic_tables(k: int, seed: int) -> tuple[dict, dict]:
    """A target p and a draft q over a 3-token vocabulary, each a distribution for every context
    (tuple of tokens) up to length k, as the verify rows and the head's steps depend on the drafts
    before them. A third of the entries are 0, so the supports differ (q proposes tokens p never
    emits, p emits tokens q never proposes)."""
    rng = np.random.default_rng(seed)

    def table():
        out = {}
        for n in range(k + 1):
            for context in product(range(VOCAB), repeat=n):
                row = rng.dirichlet(np.ones(VOCAB)) * (rng.random(VOCAB) > 1 / 3)
                if row.sum() == 0:
                    row[rng.integers(VOCAB)] = 1.0
                out[context] = row / row.sum()
        return out

    return table(), table()


def target_joint(p: dict, n: int) -> dict:
    """P(y_1..y_n) under the target itself: the product of its conditionals."""
    return {y: math.prod(p[y[:m]][y[m]] for m in range(n)) for y in product(range(VOCAB), repeat=n)}


def round_distribution(p: dict, q: dict, k: int, rule=(accepted_length, next_distribution)) -> dict:
    """The exact distribution of k+1 tokens made by one round followed, when it emitted fewer, by the
    target's own draws: a sum over the round's branches with their probabilities.

    Branches: the drafts (probability prod q_j(d_j)); for each draft, its uniform below or above
    r_j = min(1, p_j(d_j) / q_j(d_j)) (probability r_j and 1 - r_j), where `rule`'s accepted_length is
    evaluated at a uniform inside that interval; then the token from `rule`'s next_distribution
    (normalised), then the continuation. Speculative sampling's claim is that the result is
    target_joint(p, k+1)."""
    accepted, final = rule
    out = Counter()
    for drafts in product(range(VOCAB), repeat=k):
        weight = math.prod(q[drafts[:j]][drafts[j]] for j in range(k))
        if weight == 0:
            continue
        p_rows = np.stack([p[drafts[:j]] for j in range(k + 1)])
        q_rows = np.stack([q[drafts[:j]] for j in range(k)])
        ratio = [min(1.0, p_rows[j, d] / q_rows[j, d]) for j, d in enumerate(drafts)]
        for below in product((True, False), repeat=k):
            branch = weight * math.prod(r if b else 1 - r for r, b in zip(ratio, below))
            if branch == 0:
                continue
            u = np.array([r / 2 if b else (1 + r) / 2 for r, b in zip(ratio, below)])
            a = int(accepted(p_rows, q_rows, np.array(drafts), u, np))
            last = final(p_rows, q_rows, a, np)
            for token in np.flatnonzero(last):
                emitted = drafts[:a] + (int(token),)
                for rest in product(range(VOCAB), repeat=k - a):
                    y = emitted + rest
                    tail = math.prod(p[y[:m]][y[m]] for m in range(a + 1, k + 1))
                    out[y] += branch * last[token] / last.sum() * tail
    return out


def always_accept(p, q, drafts, u_accept, xp):
    return drafts.shape[0]


def resample_from_p(p, q, a, xp):
    return xp.take(p, a, axis=0)  # forgets to remove what the draft already covered


def total_variation(x: dict, y: dict) -> float:
    return 0.5 * sum(abs(x.get(key, 0.0) - y.get(key, 0.0)) for key in set(x) | set(y))


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_acceptance_rule_keeps_the_target_distribution_exactly(k, seed):
    p, q = synthetic_tables(k, seed)
    exact = target_joint(p, k + 1)
    got = round_distribution(p, q, k)
    assert max(abs(got.get(y, 0.0) - exact[y]) for y in exact) < 1e-12
    assert set(got) <= set(exact)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_exact_check_tells_wrong_rules_apart(k):
    """The enumeration above has power: accepting every draft gives the draft's distribution, and
    resampling from p instead of max(0, p - q) at a rejection over-weights what q proposes. (On
    tables where q and p share no token, the second is right by accident: the residual is then p.)"""
    p, q = synthetic_tables(k, seed=0)
    exact = target_joint(p, k + 1)
    assert total_variation(round_distribution(p, q, k, (always_accept, next_distribution)), exact) > 0.05
    assert total_variation(round_distribution(p, q, k, (accepted_length, resample_from_p)), exact) > 0.01


def monte_carlo_rounds(p: dict, q: dict, k: int, rounds: int, seed: int, rule=accept_or_resample) -> Counter:
    """`rounds` rounds with numpy's seeded generator, each completed to k+1 tokens by the target's
    own draws, as in round_distribution; all draws through `sample`."""
    rng = np.random.default_rng(seed)
    out = Counter()
    for _ in range(rounds):
        drafts = []
        for j in range(k):
            drafts.append(int(sample(q[tuple(drafts)], rng.random(), np)))
        p_rows = np.stack([p[tuple(drafts[:j])] for j in range(k + 1)])
        q_rows = np.stack([q[tuple(drafts[:j])] for j in range(k)])
        a, token = rule(p_rows, q_rows, np.array(drafts), rng.random(k), rng.random(), np)
        y = drafts[:int(a)] + [int(token)]
        while len(y) < k + 1:
            y.append(int(sample(p[tuple(y)], rng.random(), np)))
        out[tuple(y)] += 1
    return out


def binomial_outliers(counts: Counter, exact: dict, n: int, z: float) -> list:
    """The outcomes whose count is more than z standard deviations from n * p (binomial), and any
    outcome of probability 0 that occurred."""
    bad = [y for y in counts if exact.get(y, 0.0) == 0]
    for y, prob in exact.items():
        if prob > 0 and abs(counts.get(y, 0) - n * prob) > z * math.sqrt(n * prob * (1 - prob)):
            bad.append(y)
    return bad


def test_acceptance_rule_monte_carlo():
    """10000 seeded rounds at k=2 (27 outcomes of 3 tokens): each outcome's count within z = 4.9
    binomial standard deviations of 10000 p (a correct rule fails a given outcome with probability
    < 1e-6, all 27 together < 3e-5). Accepting every draft fails the same test."""
    k, rounds, z = 2, 10000, 4.9
    p, q = synthetic_tables(k, seed=3)
    exact = target_joint(p, k + 1)
    assert binomial_outliers(monte_carlo_rounds(p, q, k, rounds, seed=10), exact, rounds, z) == []

    def accept_all(p_rows, q_rows, drafts, u_accept, u_final, xp):
        return k, sample(p_rows[k], u_final, xp)

    assert binomial_outliers(monte_carlo_rounds(p, q, k, 1000, seed=11, rule=accept_all), exact, 1000, z)


# -- end to end: the first two tokens over many seeds ----------------------------------------------


@pytest.fixture(scope="module")
def micro_folder(tmp_path_factory):
    """The tiny preset cut to 4 layers of width 64, in fp32 (the same graph, its matmuls on ONNX
    Runtime's MLAS instead of the int4 reference kernel, which accumulates in double): a generation
    of 2 tokens costs ~1 ms instead of ~15 ms, which is what lets the distribution tests below draw
    thousands of generations. Builds in 0.1 s."""
    from models.build import build
    from models.config import BuildOptions, preset

    shape = dataclasses.replace(preset("tiny"), name="micro", num_hidden_layers=4, hidden_size=64,
                                intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                                linear_num_key_heads=1, linear_num_value_heads=2)
    out = tmp_path_factory.mktemp("micro") / "model"
    build(shape, out, BuildOptions(precision="fp32", ep="cpu"))
    return out


PROMPT = [500, 17, 2031]  # token ids: a fixed prompt (3 tokens, so the head is prefilled too)
E2E = SamplingParams(temperature=0.8, top_k=4)  # 16 outcomes for two tokens, the least likely ~2%
SAMPLES = 800  # generations per method
ALPHA = 1e-3  # significance of each chi-square test, fixed before the run


def exact_first_two(gen: Generator, prompt: list[int], params: SamplingParams) -> dict:
    """P(x1, x2) computed from the target's logits: x1 after the prompt, x2 after prompt + x1, each
    x1 run as the width-1 forward plain sampling runs (not advanced, so every x1 starts from the
    prompt's cache), warped as the generator warps."""
    main, n = gen.main, len(prompt)
    main.reset()
    main.ids[0, :n] = prompt
    main.forward(n)
    main.advance(n)
    first = warp(main.logits[0, n - 1], params, np).astype(np.float64)
    first /= first.sum()
    joint = {}
    for x1 in np.flatnonzero(first):
        main.ids[0, 0] = x1
        main.forward(1)
        second = warp(main.logits[0, 0], params, np).astype(np.float64)
        second /= second.sum()
        for x2 in np.flatnonzero(second):
            joint[(int(x1), int(x2))] = first[x1] * second[x2]
    return joint


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X chi-square with df degrees of freedom (closed forms for integer df; no scipy)."""
    if x == math.inf:
        return 0.0
    h = x / 2
    if df % 2 == 0:
        term = total = 1.0
        for i in range(1, df // 2):
            term *= h / i
            total += term
        return math.exp(-h) * total
    total, term = math.erfc(math.sqrt(h)), math.sqrt(h) / math.gamma(1.5)
    for i in range(df // 2):
        total += math.exp(-h) * term
        term *= h / (i + 1.5)
    return total


def goodness_of_fit(counts: Counter, exact: dict) -> float:
    """Pearson's chi-square p-value of the observed outcomes against `exact` (infinite statistic, p 0,
    where an outcome of probability 0 occurred)."""
    n = sum(counts.values())
    if any(key not in exact for key in counts):
        return 0.0
    statistic = sum((counts.get(key, 0) - n * prob) ** 2 / (n * prob) for key, prob in exact.items())
    return chi2_sf(statistic, len(exact) - 1)


def homogeneity(a: Counter, b: Counter) -> float:
    """Chi-square p-value of two samples coming from one distribution (2 x cells table)."""
    na, nb = sum(a.values()), sum(b.values())
    statistic = 0.0
    cells = set(a) | set(b)
    for key in cells:
        both = a.get(key, 0) + b.get(key, 0)
        for counts, n in ((a, na), (b, nb)):
            expected = n * both / (na + nb)
            statistic += (counts.get(key, 0) - expected) ** 2 / expected
    return chi2_sf(statistic, len(cells) - 1)


METHODS = {  # name: (generate() keywords, tokens per generation, first seed)
    "plain": ({"mode": "greedy"}, 2, 0),
    "mtp k=1": ({"mode": "mtp", "draft_tokens": 1}, 3, SAMPLES),  # 3 tokens: the first round drafts 1
    "mtp k=3": ({"mode": "mtp", "draft_tokens": 3}, 5, 2 * SAMPLES),  # 5: the first round drafts 3
}


def first_two(gen: Generator, method: str, samples: int = SAMPLES) -> Counter:
    """The first two tokens of `samples` generations, one seed each (disjoint seeds per method, so the
    samples of two methods are independent)."""
    keywords, tokens, first_seed = METHODS[method]
    out = Counter()
    for seed in range(first_seed, first_seed + samples):
        result = gen.generate(PROMPT, tokens, stop_at_eos=False, seed=seed, temperature=E2E.temperature,
                              top_k=E2E.top_k, **keywords)
        out[tuple(result.tokens[:2])] += 1
    return out


@pytest.fixture(scope="module")
def e2e(micro_folder):
    gen = Generator(micro_folder, provider="cpu", mode="mtp", max_length=16, threads=1)
    exact = exact_first_two(gen, PROMPT, E2E)
    samples = {method: first_two(gen, method) for method in METHODS}
    return gen, exact, samples


def test_the_distribution_test_has_cells_a_chi_square_can_judge(e2e):
    _, exact, _ = e2e
    assert len(exact) == 16 and math.isclose(sum(exact.values()), 1.0)
    assert SAMPLES * min(exact.values()) >= 5  # every expected count at least 5


@pytest.mark.parametrize("method", list(METHODS))
def test_first_two_tokens_follow_the_target_distribution(e2e, method):
    """Pearson's chi-square of 800 generations' first two tokens against the exact P(x1, x2) computed
    from the model's logits (16 outcomes, 15 degrees of freedom), at significance 1e-3: a correct
    sampler fails it for a given set of seeds with probability 1e-3. MTP k=1 and k=3 run the
    acceptance rule on the second token (the first comes from the prefill): a rule that does not
    keep the target's distribution moves that token's distribution toward the head's, which
    test_wrong_acceptance_rules_fail_the_same_test shows this statistic catching."""
    _, exact, samples = e2e
    assert goodness_of_fit(samples[method], exact) > ALPHA


@pytest.mark.parametrize("method", ["mtp k=1", "mtp k=3"])
def test_mtp_and_plain_sampling_agree(e2e, method):
    """The two samples against each other: chi-square homogeneity, significance 1e-3."""
    _, _, samples = e2e
    assert homogeneity(samples[method], samples["plain"]) > ALPHA


def _accept_every_draft(p, q, drafts, u_accept, u_final, xp):
    k = drafts.shape[0]
    return k, sample(p[k], u_final, xp)


def _resample_from_p(p, q, drafts, u_accept, u_final, xp):
    a = accepted_length(p, q, drafts, u_accept, xp)
    return a, sample(xp.take(p, a, axis=0), u_final, xp)


@pytest.mark.parametrize("rule, samples", [(_accept_every_draft, 200), (_resample_from_p, SAMPLES)])
def test_wrong_acceptance_rules_fail_the_same_test(e2e, monkeypatch, rule, samples):
    """The statistic above has power against wrong rules on this model: accepting every draft makes
    the second token the head's draw (it proposes tokens outside the target's top 4: the p-value is
    0 within 200 generations); resampling from p instead of max(0, p - q) at a rejection is subtler
    (its chi-square divergence from the target is 0.12: a non-centrality of ~100 at 800 samples,
    against a critical value of 37.7 at 15 degrees of freedom and 1e-3)."""
    gen, exact, _ = e2e
    monkeypatch.setattr(driver.generator, "accept_or_resample", rule)
    assert goodness_of_fit(first_two(gen, "mtp k=1", samples), exact) < ALPHA


# -- reproducibility, greedy, stats ----------------------------------------------------------------

SAMPLED = {"temperature": 0.7, "top_k": 8}


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=3, max_length=64, threads=1)


@pytest.mark.parametrize("mode, k", [("greedy", 3), ("mtp", 1), ("mtp", 3)])
def test_the_same_seed_gives_the_same_tokens(tiny, mode, k):
    ids = tiny.encode("def main():")

    def run(seed, **kw):
        return tiny.generate(ids, 12, mode=mode, draft_tokens=k, seed=seed, stop_at_eos=False, **SAMPLED, **kw)

    first = run(7)
    streamed = []
    assert run(7, on_tokens=streamed.extend).tokens == streamed == first.tokens
    assert len({tuple(first.tokens), tuple(run(8).tokens), tuple(run(9).tokens)}) == 3  # seeds differ somewhere
    # no seed: a fresh one, reported, with which the run repeats
    fresh = run(None)
    assert isinstance(fresh.stats.sampling["seed"], int)
    assert run(fresh.stats.sampling["seed"]).tokens == fresh.tokens


@pytest.mark.parametrize("k", [1, 3])
def test_head_rows_chosen_on_the_device_and_queued_ahead_draw_the_same_tokens(tiny, tiny_folder, k):
    """With sampling, where the commit keeps the verify's rows, the next round's head ids (the drafts up
    to a, then the bonus) are chosen on the device before the accept's copy, and with
    Generator.head_ahead (CUDA's default, forced on here) the next round's first head forward is queued
    there too. A wrong id would only cost acceptance (speculative sampling keeps the target's
    distribution whatever the drafts), so the check is exact: with the same seed, the tokens, the
    acceptance and the head forwards are those of the replay commit, whose ids are written by the host
    after the accept, with a and the bonus known."""
    ids = tiny.encode("def main():")
    seeds = (3, 4, 5)
    replay = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=3, max_length=64, threads=1,
                       commit="replay")
    runs = {"replay": [replay.generate(ids, 24, draft_tokens=k, seed=seed, stop_at_eos=False, **SAMPLED)
                       for seed in seeds]}
    try:
        for ahead in (False, True):
            tiny.head_ahead = ahead
            runs[ahead] = [tiny.generate(ids, 24, draft_tokens=k, seed=seed, stop_at_eos=False, **SAMPLED)
                           for seed in seeds]
    finally:
        tiny.head_ahead = False
    for host, plain, ahead in zip(runs["replay"], runs[False], runs[True]):
        assert ahead.tokens == plain.tokens == host.tokens
        assert ahead.stats.accepted == plain.stats.accepted == host.stats.accepted
        assert ahead.stats.forwards["head"] == plain.stats.forwards["head"] == plain.stats.drafted
        assert plain.stats.commits["replay"] == 0 < host.stats.commits["replay"]
    assert any(0 < r.stats.accepted < r.stats.drafted for r in runs[True])  # partial accepts were in it


def test_temperature_zero_is_greedy_decoding_itself(tiny, monkeypatch):
    """temperature 0 (with top_k 0, top_p 1 and any seed) runs the greedy code: not one sampling
    call (Sampler is never built), the same tokens as the default, in both modes."""
    greedy = {prompt: tiny.generate(prompt, 16, mode="greedy", stop_at_eos=False).tokens
              for prompt in ("def main():", "Once upon a time")}

    def no_sampler(*args, **kwargs):
        raise AssertionError("temperature 0 built a Sampler")

    monkeypatch.setattr(driver.generator, "Sampler", no_sampler)
    for prompt, tokens in greedy.items():
        for mode, k in (("greedy", 3), ("mtp", 1), ("mtp", 3)):
            result = tiny.generate(prompt, 16, mode=mode, draft_tokens=k, stop_at_eos=False, temperature=0.0,
                                   top_k=0, top_p=1.0, seed=5)
            assert result.tokens == tokens, (prompt, mode, k)
            assert result.stats.sampling is None and "sampling" not in result.stats.line()


@pytest.mark.parametrize("commit,partial", [("auto", "promote"), ("replay", "replay")])
def test_sampling_stats_count_rounds_as_greedy_does(micro_folder, commit, partial):
    """Under MTP sampling the counters mean what they mean greedy: drafts the rule accepted, tokens
    per round = accepted + 1 per round; each commit branch of the CPU EP runs (a partial accept
    promotes a slot of the window added in memory, or with commit='replay' re-runs its tokens)."""
    gen = Generator(micro_folder, provider="cpu", mode="mtp", draft_tokens=3, max_length=32, threads=1, commit=commit)
    totals = Counter()
    for seed in range(30):
        s = gen.generate(PROMPT, 12, seed=seed, stop_at_eos=False, **SAMPLED).stats
        assert s.new_tokens == 12
        assert s.rounds == sum(s.commits.values()) == s.forwards["verify"]
        assert s.forwards["re-advance"] == s.commits["replay"]
        assert s.forwards["head"] == s.drafted <= 3 * s.rounds
        assert s.round_tokens == s.accepted + s.rounds
        assert s.sampling == {"temperature": 0.7, "top_k": 8, "top_p": 1.0, "seed": seed}
        line = s.line()
        assert f"sampling temperature=0.7 top_k=8 top_p=1.0 seed={seed}" in line and "acceptance" in line
        assert s.as_dict()["sampling"]["seed"] == seed
        totals.update(s.commits)
        totals.update(accepted=s.accepted, drafted=s.drafted)
    other = "replay" if partial == "promote" else "promote"
    assert totals["full"] > 0 and totals[partial] > 0 and totals[other] == 0, totals
    assert 0 < totals["accepted"] < totals["drafted"]


# -- bad values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("knobs, needle", [
    ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"temperature": 1.0, "top_p": 0.0}, "top-p must be a number in (0, 1]"),
    ({"temperature": 1.0, "top_p": 1.5}, "top-p must be a number in (0, 1]"),
    ({"temperature": 1.0, "top_p": float("nan")}, "top-p must be a number in (0, 1]"),
    ({"temperature": 1.0, "top_k": -1}, "top-k must be an integer >= 0"),
    ({"temperature": 1.0, "top_k": 2.5}, "top-k must be an integer"),
    ({"temperature": 1.0, "top_k": True}, "top-k must be an integer"),
    ({"temperature": 1.0, "seed": -1}, "seed must be an integer from 0 to 2**64-1"),
    ({"temperature": 1.0, "seed": 2**64}, "seed must be an integer from 0 to 2**64-1"),
    ({"temperature": 1.0, "seed": 1.5}, "seed must be an integer"),
    ({"temperature": 1.0, "seed": "42"}, "seed must be an integer"),
    ({"top_k": 8}, "top-k and top-p apply only when sampling"),
    ({"temperature": 0.0, "top_p": 0.9}, "top-k and top-p apply only when sampling"),
])
def test_bad_sampling_values_are_one_line_errors(micro_greedy, knobs, needle):
    with pytest.raises(DriverError) as error:
        check_sampling(**knobs)
    assert needle in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(DriverError) as error:
        micro_greedy.generate(PROMPT, 2, **knobs)
    assert needle in str(error.value)


@pytest.fixture(scope="module")
def micro_greedy(micro_folder):
    return Generator(micro_folder, provider="cpu", mode="greedy", max_length=16, threads=1)


def test_good_values_in_any_numeric_type():
    params = check_sampling(np.float32(0.5), np.int64(3), 0.9, np.uint64(2**64 - 1))
    assert params == SamplingParams(0.5, 3, 0.9, 2**64 - 1) and not params.greedy
    assert check_sampling(1, 0, 1, None) == SamplingParams(1.0, 0, 1.0, None)
    assert check_sampling(0, seed=3).greedy  # a seed with greedy decoding is allowed, and unused


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 50, 0.9), (0.5, 0, 0.8)])
def test_warp_rows_is_each_rows_own_warp(temperature, top_k, top_p):
    """The verify's distributions (Sampler.warp_rows, one row at a time) are what warp gives each row
    alone, and on numpy what warp gives the rows together, bit for bit."""
    from driver.sampling import Sampler

    rng = np.random.default_rng(5)
    sampler = Sampler(check_sampling(temperature, top_k, top_p, 1), np)
    logits = (rng.standard_normal((4, 4096)) * 5).astype(np.float16)
    rows = sampler.warp_rows(logits)
    assert rows.shape == logits.shape and rows.dtype == np.float32
    for row, alone in zip(rows, logits):
        assert np.array_equal(row, sampler.warp(alone))
    assert np.array_equal(rows, sampler.warp(logits))
