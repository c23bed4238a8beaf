"""Counters of a generation and the optional per-phase profiler.

The profiler is off unless asked for (Generator(profile=True), --profile, or DRIVER_PROFILE=1); off,
the loop holds `None` and each phase is a `nullcontext()`, so nothing is timed or synchronised.
On, every phase ends with a device synchronisation, so its time is the device work it launched
(this perturbs the pipelining a little, which is why it is opt-in).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

@dataclass
class Stats:
    mode: str
    draft_tokens: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    rounds: int = 0                 # MTP rounds (a final greedy step is not a round)
    drafted: int = 0                # draft tokens proposed
    accepted: int = 0               # draft tokens accepted
    round_tokens: int = 0           # tokens committed by rounds (accepted drafts + bonus tokens)
    commits: Counter = field(default_factory=Counter)   # "full", "promote", "replay"
    forwards: Counter = field(default_factory=Counter)  # "prefill", "decode", "verify", "re-advance", "head", ...
    graph_runs: dict = field(default_factory=dict)      # "main"/"head" -> {CUDA graph id: runs in this generation}
    phase_ms: dict = field(default_factory=dict)        # phase -> total ms (profiler on)
    # None: greedy. Sampling: temperature, top_k, top_p and the seed the draws came from (the one
    # drawn for the run when none was given, so that it can be repeated). The counters above mean
    # the same under sampling: `accepted` counts drafts the acceptance rule kept, `round_tokens`
    # the accepted drafts plus the token each round drew after them.
    sampling: dict | None = None

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.round_tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first (the prefill forward yields the first) per second of
        decoding."""
        return (self.new_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        out = {
            "mode": self.mode,
            "draft_tokens": self.draft_tokens,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_seconds": round(self.prefill_seconds, 6),
            "decode_seconds": round(self.decode_seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4),
            "tokens_per_round": round(self.tokens_per_round, 4),
            "commits": dict(self.commits),
            "forwards": dict(self.forwards),
            "graph_runs": {k: {str(i): n for i, n in v.items()} for k, v in self.graph_runs.items()},
            "sampling": self.sampling,
        }
        if self.phase_ms:
            rounds = max(self.rounds, 1)
            out["phase_ms_per_round"] = {k: round(v / rounds, 4) for k, v in self.phase_ms.items()}
        return out

    def line(self) -> str:
        """The one-line summary the CLI ends with."""
        parts = [f"{self.new_tokens} tokens, decode {self.decode_seconds:.3f} s ({self.tokens_per_second:.1f} tok/s)",
                 f"prefill {self.prompt_tokens} tokens in {self.prefill_seconds:.3f} s"]
        if self.sampling:
            parts.append("sampling " + " ".join(f"{k}={v}" for k, v in self.sampling.items()))
        if self.mode == "mtp":
            parts.append(f"k={self.draft_tokens} acceptance {self.acceptance:.1%} "
                         f"{self.tokens_per_round:.2f} tokens/round over {self.rounds} rounds")
            parts.append("commits " + " ".join(f"{k}={v}" for k, v in sorted(self.commits.items())))
        parts.append("forwards " + " ".join(f"{k}={v}" for k, v in sorted(self.forwards.items())))
        return " | ".join(parts)


def profiling_requested(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    return os.environ.get("DRIVER_PROFILE", "") not in ("", "0")


class Profiler:
    """Accumulates wall time per phase, each phase closed by a device synchronisation."""

    def __init__(self, device):
        self.device = device
        self.ms: Counter = Counter()
        self.round_start = 0.0

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.device.synchronize()
            self.ms[name] += (time.perf_counter() - start) * 1e3

    def start_round(self) -> None:
        self.device.synchronize()
        self.round_start = time.perf_counter()

    def end_round(self) -> None:
        """Whatever the round spent outside its phases is host overhead (argmax launches, Python)."""
        self.device.synchronize()
        total = (time.perf_counter() - self.round_start) * 1e3
        self.ms["round"] += total

    def phase_ms(self) -> dict:
        named = {k: v for k, v in self.ms.items() if k != "round"}
        out = dict(named)
        if "round" in self.ms:
            out["host overhead"] = max(0.0, self.ms["round"] - sum(named.values()))
            out["round"] = self.ms["round"]
        return out
