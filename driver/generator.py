"""Greedy and MTP self-speculative generation: the whole decoding loop is in this file.

    from driver import Generator
    gen = Generator("path/to/folder", provider="cpu", mode="mtp", draft_tokens=3)
    result = gen.generate("Once upon a time", max_new_tokens=64)
    print(result.text, result.stats.line())

Loop-carried state between rounds (see docs/driver.md for the table):
  main.length  L   tokens in the main model's cache; the next token t = x_L is known but not in it
  t                the token the target predicted last (committed, already returned to the caller)
  head.length      L - 1 - pending: the MTP head's cache holds pairs (hidden h_p, token x_p+1) for p < that
  pending          accepted drafts of the last round whose pairs are not yet in the head's cache; their
                   rows (plus the row for t) wait in head.hidden_in / head.ids and go in with the next
                   round's first draft forward
  ahead            the last round already queued that forward (Generator.head_ahead, CUDA's default:
                   over all k+1 rows, before the accept's synchronisation, so the GPU runs it while
                   the host decides)
The MTP round, top to bottom, is `_mtp_round`; the three ways it commits are in `_commit`.

Sampling (temperature > 0; driver/sampling.py has the math): every token the greedy loop takes as an
argmax is drawn instead from the warped distribution, and the round accepts drafts by speculative
sampling's rule (accept_or_resample) instead of by equality; the rest of the round, the commit
included, is the same code. temperature 0 is the greedy loop itself (`sampler` is None).
"""

from __future__ import annotations

import operator
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .copy_slots import SlotPromoter
from .device import make_device
from .errors import DriverError
from .folder import ModelFolder, read_folder, with_state_window
from .runner import GraphRunner
from .sampling import Sampler, accept_or_resample, check_sampling
from .sessions import create_session, packed_nodes, rewrites
from .shared_weights import SharedWeights, shareable_names
from .stats import Profiler, Stats, profiling_requested
from .text import Text, TokenizerUnavailable

MAX_DRAFT_TOKENS = 8
DEFAULT_MAX_LENGTH = 4096  # KV buffer length when the caller does not say (the context may be far longer)
DEFAULT_PREFILL_CHUNK = 256
COMMIT_POLICIES = ("auto", "replay")  # replay: never promote a window slot (forces the snapshot path)


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids (the prompt excluded)
    text: str | None  # None when the `tokenizers` package is not installed
    stats: Stats

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "text": self.text, "stats": self.stats.as_dict()}


class Generator:
    """Sessions and device buffers for one model folder, reused across generate() calls."""

    def __init__(self, model, *, provider: str = "cpu", mode: str = "mtp", draft_tokens: int = 3,
                 max_length: int | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 cuda_graphs: bool = True, commit: str = "auto", profile: bool | None = None,
                 rewrite: bool = True, threads: int | None = None, pack: bool | None = None):
        """pack: MatMulNBits' tiles layout (driver.sessions: None, the default, packs on CUDA only;
        ignored without the rewrite). self.packed counts the nodes that run it."""
        self.folder: ModelFolder = model if isinstance(model, ModelFolder) else read_folder(Path(model))
        check_mode(mode)
        draft_tokens = check_draft_tokens(draft_tokens)
        if commit not in COMMIT_POLICIES:
            raise DriverError(f"commit must be one of {', '.join(COMMIT_POLICIES)}, got {commit!r}")
        folder = self.folder
        prefill_chunk = check_prefill_chunk(prefill_chunk, folder.context_length)
        threads = check_threads(threads)
        self.max_length = max_length or min(folder.context_length, DEFAULT_MAX_LENGTH)
        if not _is_int(self.max_length) or not 2 <= self.max_length <= folder.context_length:
            raise DriverError(f"max length must be an integer from 2 to the model's context length "
                              f"{folder.context_length}, got {self.max_length!r}")
        self.max_length = int(self.max_length)
        self.mode = mode
        self.draft_tokens = draft_tokens
        self.commit_policy = commit
        # The chunk sizes the prefill buffers (logits are chunk x vocab); no prompt is longer than
        # max_length, so a wider chunk would only allocate rows no forward uses.
        self.prefill_chunk = min(prefill_chunk, self.max_length)
        self.profile = profiling_requested(profile)
        self._text: Text | None = None
        if folder.main.state_window and provider != "cuda" and "linear-attention" not in rewrites(rewrite):
            raise DriverError(f"{folder.path} was exported with state_window={folder.main.state_window}, which ONNX "
                              "Runtime's CPU kernels refuse; run it with the rewrite (the default: ort_mtp::GatedDeltaNet "
                              "takes it) or with --provider cuda")
        self.device = make_device(provider, graph_capture=cuda_graphs, threads=threads)
        self.eos = set(folder.eos_token_ids)

        # CUDA graphs (captured lazily, per width and state parity) for every width a round can run:
        # 1 (decode, head chain steps), k+1 (verify), a+1 (re-advance, the head's first forward).
        max_width = max(self.prefill_chunk, MAX_DRAFT_TOKENS + 1)
        widths = range(1, MAX_DRAFT_TOKENS + 2)
        capture = self.device.graph_capture
        head_spec = folder.require_mtp() if mode == "mtp" else None
        # Each session would load its own copy of the embedding and lm_head the head's graph reads from
        # the main model's: on CUDA one copy on the device serves both (driver.shared_weights).
        self.shared_weights = (SharedWeights(self.device, shareable_names(folder.main.proto, head_spec.proto))
                               if head_spec is not None and self.device.shares_weights else None)
        session, self.rewritten = create_session(folder.main, self.device, self.max_length, rewrite, capture, pack,
                                                 state_window=self._state_window_wanted(mode, rewrite),
                                                 shared=self.shared_weights)
        self.packed = packed_nodes(session)
        main_spec = with_state_window(folder.main, session.state_window) if session.state_window else folder.main
        self.main = GraphRunner(main_spec, session, self.device, self.max_length, max_width,
                                folder.vocab_size, folder.hidden_size, capture_widths=widths)
        self.head = None
        self.promoter = None
        # A round's drafts [0, k) and the verify's target tokens [k, 2k+1), side by side so that the
        # accept reads both with one device-to-host copy.
        self._round_ids = self.device.zeros((2 * MAX_DRAFT_TOKENS + 1,), np.int64)
        self._token_host = [self.device.host_buffer((1,), np.int64) for _ in range(2)]  # _decode_run's copies
        self._round_host = self.device.host_buffer((2 * MAX_DRAFT_TOKENS + 1,), np.int64)  # the accept's copy
        self._row_iota = self.device.xp.arange(MAX_DRAFT_TOKENS, dtype=np.int64)  # draft rows, for a device mask
        # Queue the next round's first head forward before the accept's synchronisation (_mtp_round):
        # where runs are asynchronous (CUDA) the GPU runs it while the host decides the accept. On the
        # CPU it would only run a wider forward than needed.
        self.head_ahead = self.device.asynchronous
        if head_spec is not None:
            session, swapped = create_session(head_spec, self.device, self.max_length, rewrite, capture, pack,
                                              shared=self.shared_weights)
            self.rewritten += swapped
            self.packed += packed_nodes(session)
            self.head = GraphRunner(head_spec, session, self.device, self.max_length, max_width,
                                    folder.vocab_size, folder.hidden_size, capture_widths=widths)
            if self.main.spec.state_window:
                self.promoter = SlotPromoter(self.main)

    def _state_window_wanted(self, mode: str, rewrite) -> int:
        """The state window to add in memory (ops.state_window) to a folder exported without one: k+1
        slots for MTP with k drafts, so that a partial accept copies a slot (promote) instead of
        re-running its tokens (replay); 0 for greedy (a window only adds slots to write), with
        --commit replay, and for a folder that has a window or no linear-attention state."""
        spec = self.folder.main
        if mode != "mtp" or self.commit_policy == "replay" or spec.state_window or not spec.recurrent:
            return 0
        return self.draft_tokens + 1 if "linear-attention" in rewrites(rewrite) else 0

    # -- public API -----------------------------------------------------------------------------------

    @property
    def text(self) -> Text:
        if self._text is None:
            self._text = Text(self.folder.tokenizer)
        return self._text

    def encode(self, prompt: str) -> list[int]:
        return self.text.encode(prompt)

    def decode(self, ids) -> str:
        return self.text.decode(ids)

    def generate(self, prompt, max_new_tokens: int = 64, *, mode: str | None = None,
                 draft_tokens: int | None = None, on_tokens=None, stop_at_eos: bool = True,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None) -> GenerationResult:
        """Generates up to max_new_tokens after `prompt` (text or token ids). on_tokens(list[int]) is
        called with each batch of tokens as soon as they are committed.

        temperature 0 is greedy decoding; > 0 samples from the target's distribution warped by
        temperature, top_k (0: off) and top_p (1: off), in both modes (MTP by speculative sampling).
        seed: the same seed, prompt, mode and k give the same tokens on the same provider; None draws
        a fresh seed, reported in stats.sampling."""
        sampling = check_sampling(temperature, top_k, top_p, seed)
        with self.device.active():
            sampler = None if sampling.greedy else Sampler(sampling, self.device.xp)
            return self._generate(prompt, max_new_tokens, mode, draft_tokens, on_tokens, stop_at_eos, sampler)

    def _generate(self, prompt, max_new_tokens, mode, draft_tokens, on_tokens, stop_at_eos,
                  sampler: Sampler | None) -> GenerationResult:
        mode = check_mode(mode or self.mode)
        k = check_draft_tokens(self.draft_tokens if draft_tokens is None else draft_tokens)
        if mode == "mtp" and self.head is None:
            raise DriverError("this Generator was built with mode='greedy'; build one with mode='mtp'")
        if not isinstance(prompt, str) and not hasattr(prompt, "__iter__"):
            raise DriverError(f"the prompt must be text or a sequence of token ids, got {type(prompt).__name__}")
        ids = check_token_ids(self.encode(prompt) if isinstance(prompt, str) else prompt, self.folder.vocab_size)
        max_new_tokens = self.check_lengths(len(ids), max_new_tokens)
        stats = Stats(mode=mode, draft_tokens=k if mode == "mtp" else 0, prompt_tokens=len(ids))
        if sampler is not None:
            stats.sampling = {**sampler.params.describe(), "seed": sampler.seed}
        profiler = Profiler(self.device) if self.profile and mode == "mtp" else None
        out: list[int] = []

        def emit(tokens) -> bool:
            """Appends committed tokens; True when generation is over (EOS or enough tokens)."""
            done = False
            kept = []
            for tok in tokens:
                kept.append(tok)
                if (stop_at_eos and tok in self.eos) or len(out) + len(kept) >= max_new_tokens:
                    done = True
                    break
            out.extend(kept)
            if on_tokens and kept:
                on_tokens(kept)
            return done

        runners = {"main": self.main, "head": self.head} if self.head is not None else {"main": self.main}
        runs_before = {name: dict(r.graph_runs) for name, r in runners.items()}
        start = time.perf_counter()
        t = self._prefill(ids, with_head=mode == "mtp", stats=stats, sampler=sampler)
        self.device.synchronize()
        stats.prefill_seconds = time.perf_counter() - start
        start = time.perf_counter()
        done = emit([t])
        pending = 0
        ahead = False  # the last round queued this round's first head forward
        while not done:
            remaining = max_new_tokens - len(out)
            k_round = min(k, remaining - 1) if mode == "mtp" else 0
            if k_round < 1:  # greedy (every token left), or MTP's last token: width-1 forwards
                self._decode_run(t, remaining, stats, sampler, emit)
                break
            # another MTP round surely follows this one (unless EOS) when, even with all k_round drafts
            # accepted, at least 2 tokens are left after it
            tokens, pending, ahead = self._mtp_round(t, k_round, pending, ahead, remaining >= k_round + 3,
                                                     stats, profiler, sampler)
            t = tokens[-1]
            done = emit(tokens)
        self.device.synchronize()
        stats.decode_seconds = time.perf_counter() - start
        stats.new_tokens = len(out)
        stats.graph_runs = {name: {i: n - runs_before[name].get(i, 0) for i, n in r.graph_runs.items()
                                   if n > runs_before[name].get(i, 0)} for name, r in runners.items()}
        if profiler:
            stats.phase_ms = profiler.phase_ms()
        try:
            text = self.decode(out)
        except TokenizerUnavailable:  # token ids in, token ids out
            text = None
        return GenerationResult(out, text, stats)

    def check_lengths(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """max_new_tokens as an int, if the prompt and that many new tokens fit the Generator."""
        if prompt_tokens < 1:
            raise DriverError("the prompt is empty")
        if not _is_int(max_new_tokens) or max_new_tokens < 1:
            raise DriverError(f"max new tokens must be a positive integer, got {max_new_tokens!r}")
        limit = self.max_length
        what = "context length" if limit == self.folder.context_length else "max length"
        if prompt_tokens >= limit:
            raise DriverError(f"the prompt has {prompt_tokens} tokens, more than the {what} {limit} allows "
                              f"(it needs room for at least one new token)")
        if prompt_tokens + max_new_tokens > limit:
            raise DriverError(f"{max_new_tokens} new tokens after a {prompt_tokens}-token prompt exceed the "
                              f"{what} of {limit} tokens (at most {limit - prompt_tokens} new tokens fit)")
        return int(max_new_tokens)

    # -- prefill and greedy ---------------------------------------------------------------------------

    def _prefill(self, ids: list[int], with_head: bool, stats: Stats, sampler: Sampler | None) -> int:
        """Runs the prompt through the main model in chunks (and the head over the prompt's pairs
        (h_p, x_p+1)); returns the first generated token and leaves its hidden in head.hidden_in[0, 0]."""
        main, head, xp = self.main, self.head, self.device.xp
        main.reset()
        if with_head:
            head.reset()
        chunk = self.prefill_chunk
        for start in range(0, len(ids), chunk):
            piece = ids[start:start + chunk]
            width = len(piece)
            main.ids[0, :width] = xp.asarray(piece, dtype=np.int64)
            main.forward(width)
            main.advance(width)
            stats.forwards["prefill"] += 1
            if with_head:
                # pairs (h_p, x_p+1) for this chunk; the prompt's last position pairs with the first
                # generated token, which goes in with the first round's draft forward
                pairs = ids[start + 1:start + width + 1]
                if pairs:
                    head.hidden_in[0, :len(pairs)] = main.hidden[0, :len(pairs)]
                    head.ids[0, :len(pairs)] = xp.asarray(pairs, dtype=np.int64)
                    head.forward(len(pairs))
                    head.advance(len(pairs))
                    stats.forwards["head-prefill"] += 1
        last = (len(ids) - 1) % chunk  # row of the prompt's last token in the last chunk
        t = int(self.device.to_host(self._pick(main.logits[0, last], sampler)))
        if with_head:
            head.hidden_in[0, 0] = main.hidden[0, last]
            head.ids[0, 0] = t
        return t

    def _decode_run(self, t: int, tokens: int, stats: Stats, sampler: Sampler | None, emit) -> None:
        """Greedy (or plain sampling): width-1 forwards from token t, each token passed to emit, until
        `tokens` tokens or emit says the generation is over (EOS). (MTP uses it for a generation's last
        token, when there is no room for a draft.)

        Each forward's token goes into the ids buffer on the device, as the next forward's input, and
        to the host by an asynchronous copy that the host waits for only after it has queued the next
        forward: on CUDA the GPU then runs forward after forward without waiting for the host's
        round trip in between (on the CPU, where runs are synchronous, the order is all that changes).
        The forward queued after an EOS token is wasted: counted in stats, its token never emitted."""
        main, device = self.main, self.device
        main.ids[0, 0] = t
        copying = None  # the last token's (copy, host buffer): copied, not yet emitted
        for i in range(tokens):
            main.forward(1)
            main.advance(1)
            stats.forwards["decode"] += 1
            token = self._pick(main.logits[0, 0], sampler).astype(np.int64, copy=False)
            main.ids[0, 0] = token  # the next forward's input, without the host
            buffer = self._token_host[i % 2]  # the other one may still be read below
            started = device.start_to_host(token, buffer)
            if copying is not None and self._emit_copied(copying, emit):
                return
            copying = (started, buffer)
        self._emit_copied(copying, emit)

    def _emit_copied(self, copying, emit) -> bool:
        """Waits for a token's copy to the host and emits it; True when the generation is over."""
        started, buffer = copying
        self.device.wait_to_host(started)
        return emit([int(buffer[0])])

    def _pick(self, logits, sampler: Sampler | None, keep: list | None = None):
        """The token after one row of logits, as a device integer: its argmax (greedy), or a draw
        from its warped distribution (sampling; `keep` collects that distribution)."""
        if sampler is None:
            return self.device.xp.argmax(logits)
        return sampler.draw(logits, keep)

    # -- MTP ------------------------------------------------------------------------------------------

    def _mtp_round(self, t: int, k: int, pending: int, ahead: bool, more: bool, stats: Stats, profiler,
                   sampler: Sampler | None) -> tuple[list[int], int, bool]:
        """One round: draft k tokens with the head, verify [t, d_0..d_k-1] in one forward of width
        k+1, accept the longest prefix the target agrees with plus its bonus token, commit.
        Returns the committed tokens (accepted drafts + bonus), the new pending count, and whether
        the next round's first head forward is already queued (`ahead` for the next call: it is
        queued where `more`, another round follows, and the head's input rows are known before the
        accept). Sampling: the drafts are drawn from the head's warped distributions q_j, and
        accepted by speculative sampling's rule against the target's p_j; the bonus is then a draw too."""
        main, head, xp = self.main, self.head, self.device.xp
        phase = profiler.phase if profiler else _no_phase
        if profiler:
            profiler.start_round()
        L = main.length
        q = []  # sampling: the distribution each draft was drawn from (the acceptance rule needs q_j(d_j))

        # 1. Draft. The first head forward takes the `pending` rows left by the last round (accepted
        #    drafts, each with the target's hidden) plus the row (h_L-1, t); its last row drafts d_0.
        #    Then the head chains on its own hidden: (g_j-1, d_j-1) -> d_j.
        with phase("draft"):
            drafts = self._round_ids[:k]
            if not ahead:  # else the last round queued it, wider (step 3)
                head.forward(pending + 1)
                stats.forwards["head"] += 1
            head.advance(pending + 1)
            drafts[0] = self._pick(head.logits[0, pending], sampler, q)
            for j in range(1, k):
                head.hidden_in[0, 0] = head.hidden[0, pending if j == 1 else 0]
                head.ids[0, 0] = drafts[j - 1]
                head.forward(1)
                head.advance(1)
                drafts[j] = self._pick(head.logits[0, 0], sampler, q)
            head.rewind(L)  # the chained steps were speculative: keep pairs up to (h_L-1, t)
            stats.forwards["head"] += k - 1

        # 2. Verify [t, d_0 .. d_k-1] in one forward of width k+1.
        with phase("verify"):
            main.ids[0, 0] = t
            main.ids[0, 1:k + 1] = drafts
            main.forward(k + 1)
            stats.forwards["verify"] += 1
            if sampler is None:
                # The target's token after each position, row by row: the 1-D argmax a greedy step takes
                # (on CUDA CuPy's device-wide CUB reduction). An argmax over the last axis of [k+1, V]
                # is a reduction with one thread block per row in CuPy: slow on a 248320-entry
                # vocabulary (cupy_cub_argmax in bench/kernel_profile_27b.py's profile of a round).
                target = self._round_ids[k:2 * k + 1]
                for j in range(k + 1):
                    target[j] = xp.argmax(main.logits[0, j])
            else:
                p = sampler.warp_rows(main.logits[0, :k + 1])  # the target's distribution after each position

        # 3. Accept: the round's only host synchronisation (k drafts and k+1 target tokens, or k
        #    drafts, a and the bonus).
        early = self._commit_keeps_verify_rows(k)
        with phase("accept"):
            # The head's next input rows (step 5), queued ahead of the synchronisation where the commit
            # keeps the verify's rows, so that the device writes them while the host waits: every one of
            # the k+1 rows (the next head forward reads the first a+1). The hidden rows are the verify's;
            # greedy's ids are the target's tokens (an accepted draft equals the target's token at its
            # position, and the bonus is the next one); sampling's are the drafts up to a, then the
            # bonus, chosen on the device.
            if early:
                head.hidden_in[0, :k + 1] = main.hidden[0, :k + 1]
            if sampler is None:
                if early:
                    head.ids[0, :k + 1] = target
                both = self._round_host[:2 * k + 1]
                copied = self.device.start_to_host(self._round_ids[:2 * k + 1], both)
            else:
                # d_j kept with probability min(1, p_j(d_j) / q_j(d_j)) up to the first rejection; the
                # bonus drawn from max(0, p_a - q_a) there, or from p_k after k acceptances
                u_accept, u_last = sampler.uniforms(k), sampler.uniforms(1)[0]
                a, bonus = accept_or_resample(p, xp.stack(q), drafts, u_accept, u_last, xp)
                if early:
                    head.ids[0, :k] = xp.where(self._row_iota[:k] < a, drafts, bonus)
                    head.ids[0, k] = bonus
                decided = xp.concatenate([drafts, xp.stack([a, bonus])])
                both = self._round_host[:k + 2]
                copied = self.device.start_to_host(decided, both)
        # With all k+1 rows in place, the next round's first head forward needs nothing from the host
        # but a: queued now over all k+1 rows at the head's length (L), it runs while the host waits
        # for the copy above and decides. Its rows 0..a are those the next round reads (row j attends
        # only to the cache and rows <= j, and a row's result does not depend on the forward's width);
        # the rows after a are never read, and the KV rows they write lie past the head's length, for
        # the next forwards to overwrite.
        go_ahead = early and more and self.head_ahead
        if go_ahead:
            with phase("draft"):
                head.forward(k + 1)
            stats.forwards["head"] += 1
        with phase("accept"):
            self.device.wait_to_host(copied)
            if sampler is None:
                drafted, wanted = both[:k].tolist(), both[k:].tolist()
                a = 0
                while a < k and drafted[a] == wanted[a]:
                    a += 1
                bonus = wanted[a]  # the target's token after the accepted prefix
            else:
                drafted, (a, bonus) = both[:k].tolist(), both[k:].tolist()
        stats.rounds += 1
        stats.drafted += k
        stats.accepted += a
        stats.round_tokens += a + 1

        # 4. Commit the first a+1 verify tokens [t, d_0 .. d_a-1] in the main model.
        self._commit(a, k, stats, phase)

        # 5. Leave the head's next input rows: (h_L+j, d_j) for the accepted drafts and (h_L+a, bonus),
        #    hidden rows from the forward that committed them (verify or re-advance). Already queued in
        #    step 3 where the verify's rows are the committed ones.
        if not early:
            head.hidden_in[0, :a + 1] = main.hidden[0, :a + 1]
            head.ids[0, :a] = drafts[:a]
            head.ids[0, a] = bonus
        if profiler:
            profiler.end_round()
        return drafted[:a] + [bonus], a, go_ahead

    def _commit_keeps_verify_rows(self, k: int) -> bool:
        """Whether _commit keeps the verify's hidden rows for every a (full or promote), i.e. never
        re-runs the accepted tokens (replay), whose forward rewrites them."""
        window = self.main.spec.state_window
        return self.promoter is not None and window >= k + 1 and self.commit_policy != "replay"

    def _commit(self, a: int, k: int, stats: Stats, phase) -> None:
        """Makes the main model's cache and state those after [t, d_0 .. d_a-1] (a+1 tokens).

        full     a == k: the verify's state is the committed state. Nothing to do but keep it.
        promote  a < k, windowed state with W >= k+1: keep the verify's state and copy window slot
                 a+W-(k+1) (the state after token a) into slot W-1 (the one the next forward reads).
        replay   a < k otherwise: the verify read the state from the other buffer, which is still
                 the state before it (the snapshot); keep that one and re-advance a+1 tokens.
        """
        main = self.main
        window = main.spec.state_window
        if a == k:
            main.advance(k + 1)
            stats.commits["full"] += 1
        elif self._commit_keeps_verify_rows(k):
            with phase("commit"):
                main.advance(a + 1)
                self.promoter.promote(a + window - (k + 1), window - 1)
            stats.commits["promote"] += 1
        else:
            with phase("re-advance"):
                main.forward(a + 1)  # ids[:, :a+1] still hold [t, d_0 .. d_a-1]
                main.advance(a + 1)
            stats.forwards["re-advance"] += 1
            stats.commits["replay"] += 1


def _is_int(value) -> bool:
    """An integer of any kind (Python's, numpy's), not a bool: what a count or a size may be."""
    if isinstance(value, (bool, np.bool_)):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def check_mode(mode) -> str:
    if mode not in ("greedy", "mtp"):
        raise DriverError(f"mode must be greedy or mtp, got {mode!r}")
    return mode


def check_draft_tokens(k) -> int:
    if not _is_int(k) or not 1 <= k <= MAX_DRAFT_TOKENS:
        raise DriverError(f"draft tokens must be an integer from 1 to {MAX_DRAFT_TOKENS}, got {k!r}")
    return int(k)


def check_prefill_chunk(chunk, context_length: int) -> int:
    if not _is_int(chunk) or not 1 <= chunk <= context_length:
        raise DriverError(f"prefill chunk must be an integer from 1 to the model's context length {context_length}, "
                          f"got {chunk!r}")
    return int(chunk)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_threads(threads) -> int | None:
    """None leaves the choice to ONNX Runtime. More threads than cores only slow ORT down, and a
    few thousand make it spin up (and allocate) for minutes before the first forward."""
    if threads is None:
        return None
    cores = available_cores()
    if not _is_int(threads) or not 1 <= threads <= cores:
        raise DriverError(f"threads must be an integer from 1 to {cores} (the CPU cores available here), "
                          f"got {threads!r}")
    return int(threads)


def check_token_ids(ids, vocab_size: int) -> list[int]:
    """The ids as a list of ints, each a vocabulary entry: ORT's Gather would read a negative id
    from the end of the table and fail on one past it with an error that names no token."""
    return [_token_id(token, position, vocab_size) for position, token in enumerate(ids)]


def _token_id(token, position: int, vocab_size: int) -> int:
    try:
        value = operator.index(token)  # ints and numpy integers; not floats or strings
    except TypeError:
        value = None
    if value is None or isinstance(token, bool):
        raise DriverError(f"token ids must be integers, got {token!r} at position {position}")
    if not 0 <= value < vocab_size:
        raise DriverError(f"token id {value} at position {position} is outside the vocabulary (0 to {vocab_size - 1})")
    return value


def _no_phase(name: str):
    return nullcontext()
