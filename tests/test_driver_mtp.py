"""MTP self-speculative decoding equals the driver's own greedy decoding, token for token (CPU)."""

from __future__ import annotations

import pytest

from driver import Generator
from driver.identity import SAMPLE_PROMPTS as PROMPTS

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def generator(tiny_folder):
    return Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=3, max_length=128, threads=1)


@pytest.fixture(scope="module")
def greedy_streams(tiny_folder):
    """Greedy decoding's streams from a greedy Generator: its session has no state window."""
    greedy = Generator(tiny_folder, provider="cpu", mode="greedy", max_length=128, threads=1)
    assert greedy.main.spec.state_window == 0 and greedy.promoter is None
    return {p: greedy.generate(p, NEW_TOKENS, stop_at_eos=False).tokens for p in PROMPTS}


@pytest.mark.parametrize("k", range(1, 9))
def test_mtp_equals_greedy_over_prompts(generator, greedy_streams, k):
    """The tiny folder has no state window; the MTP Generator (draft_tokens=3) adds one of 4 slots in
    memory (ops.state_window): a partial accept of k <= 3 drafts promotes a slot, of more re-runs its
    tokens. Every stream is the greedy Generator's, which has no window."""
    assert len(PROMPTS) >= 20
    assert generator.main.spec.state_window == 4 and generator.promoter is not None
    totals = {"full": 0, "replay": 0, "promote": 0, "accepted": 0, "drafted": 0}
    for prompt in PROMPTS:
        result = generator.generate(prompt, NEW_TOKENS, draft_tokens=k, stop_at_eos=False)
        assert result.tokens == greedy_streams[prompt], f"k={k} diverged from greedy on {prompt!r}"
        s = result.stats
        assert s.new_tokens == NEW_TOKENS
        assert s.rounds == sum(s.commits.values())
        assert s.forwards["verify"] == s.rounds
        assert s.forwards["re-advance"] == s.commits["replay"]
        assert s.forwards["head"] == s.drafted <= k * s.rounds  # the last round may draft fewer
        assert s.round_tokens == s.accepted + s.rounds
        for key in ("full", "replay", "promote"):
            totals[key] += s.commits[key]
        totals["accepted"] += s.accepted
        totals["drafted"] += s.drafted
    if k + 1 <= 4:
        assert totals["full"] > 0 and totals["promote"] > 0 and totals["replay"] == 0, totals
    else:  # past the window: snapshot restore + re-advance (a stream's last round may fit the window)
        assert totals["replay"] > totals["promote"], totals
    assert 0 < totals["accepted"] < totals["drafted"]


@pytest.mark.parametrize("k", [1, 3, 4])
def test_head_forward_queued_ahead_changes_no_draft(tiny_folder, greedy_streams, k):
    """Generator.head_ahead (on by default where runs are asynchronous, CUDA) queues the next round's
    first head forward before the accept, over all k+1 rows instead of the a+1 the round reads. Forced
    on here: every draft, hence the acceptance and the tokens, are those of the default CPU path, and
    the queued forwards replace the rounds' first head forwards one for one. A generation that fills
    max_length exactly never runs a head forward past it."""
    plain = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=k, max_length=128, threads=1)
    ahead = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=k, max_length=128, threads=1)
    assert not plain.head_ahead
    ahead.head_ahead = True
    widths = {"plain": [], "ahead": []}
    for name, gen in (("plain", plain), ("ahead", ahead)):
        gen.head.forward = lambda width, run=gen.head.forward, seen=widths[name]: (seen.append(width), run(width))[1]
    for prompt in PROMPTS[:8]:
        want = plain.generate(prompt, NEW_TOKENS, stop_at_eos=False)
        got = ahead.generate(prompt, NEW_TOKENS, stop_at_eos=False)
        assert got.tokens == want.tokens == greedy_streams[prompt]
        s, w = got.stats, want.stats
        assert (s.accepted, s.drafted, s.rounds, s.commits) == (w.accepted, w.drafted, w.rounds, w.commits)
        assert s.forwards["head"] == w.forwards["head"] == s.drafted
    # the same number of head forwards, but the rounds' first ones k+1 wide where they were queued ahead
    assert len(widths["ahead"]) == len(widths["plain"])
    assert widths["ahead"].count(k + 1) > widths["plain"].count(k + 1)
    prompt = list(range(3, 3 + 128 - 40))
    full = ahead.generate(prompt, 40, stop_at_eos=False)
    assert full.tokens == plain.generate(prompt, 40, stop_at_eos=False).tokens
    assert ahead.head.length <= 128


@pytest.fixture(scope="module")
def windowed_tiny(tmp_path_factory):
    """The tiny preset exported with state_window=4 for the CPU EP: the same weights as tiny_folder, the
    linear-attention state in 4 per-token slots (only ort_mtp::GatedDeltaNet runs it on the CPU)."""
    from models.build import build
    from models.config import BuildOptions, preset

    out = tmp_path_factory.mktemp("tiny_w4") / "model"
    build(preset("tiny"), out, BuildOptions(precision="int4", ep="cpu", state_window=4))
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_windowed_cpu_folder_promotes_slots_and_equals_greedy(windowed_tiny, greedy_streams, k):
    """On a windowed folder a partial accept keeps the verify's state and promotes its slot (k + 1 <= 4)
    instead of re-advancing; past the window (k = 5) it mostly replays. Every stream is the unwindowed
    folder's greedy stream."""
    gen = Generator(windowed_tiny, provider="cpu", mode="mtp", draft_tokens=k, max_length=128, threads=1)
    assert gen.promoter is not None
    commits = {"full": 0, "replay": 0, "promote": 0}
    for prompt in PROMPTS[:8]:
        result = gen.generate(prompt, NEW_TOKENS, stop_at_eos=False)
        assert result.tokens == greedy_streams[prompt], f"k={k} diverged from greedy on {prompt!r}"
        assert result.stats.forwards["re-advance"] == result.stats.commits["replay"]
        for key in commits:
            commits[key] += result.stats.commits[key]
    if k + 1 <= 4:
        assert commits["promote"] > 0 and commits["replay"] == 0, commits
    else:  # (a stream's last round may draft fewer than k, and then fit the window)
        assert commits["replay"] > commits["promote"], commits
    greedy = gen.generate(PROMPTS[0], NEW_TOKENS, mode="greedy", stop_at_eos=False)
    assert greedy.tokens == greedy_streams[PROMPTS[0]]


def test_replay_policy_adds_no_window(tiny_folder, greedy_streams):
    """commit='replay' keeps the folder's states as they are (no window in memory): every partial accept
    re-runs its tokens, and the streams stay greedy's."""
    forced = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=2, commit="replay", max_length=128,
                       threads=1)
    assert forced.main.spec.state_window == 0 and forced.promoter is None
    replays = 0
    for prompt in PROMPTS[:6]:
        result = forced.generate(prompt, NEW_TOKENS, stop_at_eos=False)
        assert result.tokens == greedy_streams[prompt]
        assert result.stats.commits["promote"] == 0
        replays += result.stats.commits["replay"]
    assert replays > 0


def test_no_window_where_a_block_stays_on_ort(tiny_folder, greedy_streams):
    """Without the linear-attention rewrite the blocks stay on ONNX Runtime's ops, whose CPU kernels
    take no window: the session keeps the folder's states and MTP replays."""
    gen = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=2, max_length=128, threads=1,
                    rewrite=("matmul",))
    assert gen.main.spec.state_window == 0 and gen.promoter is None
    result = gen.generate(PROMPTS[0], NEW_TOKENS, stop_at_eos=False)
    assert result.stats.commits["promote"] == 0


def test_chunked_prefill_matches_one_forward(tiny_folder, greedy_streams):
    chunked = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=3, prefill_chunk=3, max_length=128,
                        threads=1)
    for prompt in PROMPTS[:8]:
        assert chunked.generate(prompt, NEW_TOKENS, mode="greedy", stop_at_eos=False).tokens == greedy_streams[prompt]
        result = chunked.generate(prompt, NEW_TOKENS, stop_at_eos=False)
        assert result.tokens == greedy_streams[prompt]
        assert result.stats.forwards["prefill"] == -(-result.stats.prompt_tokens // 3)


def test_generation_stops_at_eos_and_at_max_tokens(tiny_folder, monkeypatch):
    gen = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=3, max_length=64, threads=1)
    ids = gen.encode("def main():")
    greedy = gen.generate(ids, 12, mode="greedy", stop_at_eos=False).tokens
    assert len(greedy) == 12
    one = gen.generate(ids, 1)
    assert one.tokens == greedy[:1] and one.stats.rounds == 0
    streamed = []
    result = gen.generate(ids, 12, on_tokens=streamed.extend, stop_at_eos=False)
    assert streamed == result.tokens == greedy
    # pretend greedy's 6th token is the end of text: both modes stop right after its first occurrence
    stop = greedy[5]
    monkeypatch.setattr(gen, "eos", {stop})
    expected = greedy[:greedy.index(stop) + 1]
    stopped = gen.generate(ids, 12, mode="greedy")
    assert stopped.tokens == expected
    # the decode loop reads each token one forward late, so the forward queued after the end-of-text
    # token ran (counted) and its token was dropped: len(expected) - 1 forwards made tokens, one more ran
    assert stopped.stats.forwards["decode"] == len(expected) < 12
    assert gen.generate(ids, 12).tokens == expected
    monkeypatch.setattr(gen, "eos", set())
    assert gen.generate(ids, 12, mode="greedy").tokens == greedy  # nothing of the dropped forward is left


def test_profiler_reports_phases_only_when_asked(tiny_folder, monkeypatch):
    quiet = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=2, max_length=64, threads=1)
    assert quiet.generate("def main():", 12).stats.phase_ms == {}
    monkeypatch.setenv("DRIVER_PROFILE", "1")
    loud = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=2, max_length=64, threads=1)
    phases = loud.generate("def main():", 12, stop_at_eos=False).stats.as_dict()["phase_ms_per_round"]
    assert {"draft", "verify", "accept", "host overhead", "round"} <= set(phases)
    assert all(v >= 0 for v in phases.values())


def test_every_round_forward_gets_a_graph_id_per_width_and_parity(tiny_folder):
    """The CUDA-graph bookkeeping, run on the CPU EP (which ignores gpu_graph_id): every forward of
    a round is tagged 1 + 2*width + parity, prefill chunks wider than 9 run untagged (eager)."""
    gen = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=3, max_length=128, threads=1)
    gen.device.graph_capture = True
    prompt = gen.encode("class Parser:\n    def __init__(self, text):")
    assert len(prompt) > 10
    result = gen.generate(prompt, 24, stop_at_eos=False)
    s = result.stats
    main_runs, head_runs = s.graph_runs["main"], s.graph_runs["head"]
    assert sum(main_runs.values()) == s.forwards["verify"] + s.forwards["re-advance"] + s.forwards["decode"]
    assert sum(head_runs.values()) == s.forwards["head"]
    assert {(i - 1) // 2 for i in main_runs} <= set(range(1, 10))
    assert {(i - 1) // 2 for i in main_runs if (i - 1) // 2 == 4} == {4}  # the verify width k+1
    assert all((i - 1) % 2 == 0 for i in head_runs)  # the head has no recurrent state: parity 0
    assert {(i - 1) % 2 for i in main_runs} == {0, 1}  # verifies alternate state buffers


def test_mtp_equals_greedy_where_attention_comes_first(builder_attention_first_folder):
    """A builder folder whose attention layer precedes its linear-attention layers: every verify row and
    committed state must be the decode steps' bits (ort_mtp::GroupQueryAttention), or a rounding there
    would reach the states. MTP prints greedy's stream on every sample prompt at k = 1..8."""
    gen = Generator(builder_attention_first_folder, provider="cpu", mode="mtp", max_length=128, threads=1)
    totals = {"full": 0, "replay": 0}
    for prompt in PROMPTS:
        greedy = gen.generate(prompt, 16, mode="greedy", stop_at_eos=False).tokens
        for k in range(1, 9):
            result = gen.generate(prompt, 16, draft_tokens=k, stop_at_eos=False)
            assert result.tokens == greedy, f"k={k} diverged from greedy on {prompt!r}"
            for key in totals:
                totals[key] += result.stats.commits[key]
    assert totals["full"] > 0 and totals["replay"] > 0


def test_cpu_sessions_stop_their_threads_spinning_when_a_run_returns(generator):
    """MTP alternates the head's and the main graph's sessions; each has its own thread pool, and
    threads left spinning after a run would compete with the other session's run for the cores."""
    from driver.device import FORCE_SPINNING_STOP

    for runner in (generator.main, generator.head):
        options = runner.session.get_session_options()
        assert options.get_session_config_entry(FORCE_SPINNING_STOP) == "1"
