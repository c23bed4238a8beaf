"""Loading an MTP Generator on the CPU with two builds of the library, each in its own process
(one after the other, rounds repeated): seconds to create it (both sessions, the int8 kernel's grouped
weight copies included), the process's peak resident memory, its AnonHugePages after loading, and the
first 8 tokens (to check that they agree).

    python bench/results/2026-12-05-pack-once/load_probe.py --model /tmp/small --library before=A.so \
        --library after=B.so --rounds 3 --out load.json
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def child(model: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from driver import Generator

    start = time.perf_counter()
    gen = Generator(model, provider="cpu", mode="mtp", draft_tokens=3, threads=2)
    load_s = time.perf_counter() - start
    with open("/proc/self/smaps_rollup") as f:
        huge_kb = int(next(line for line in f if "AnonHuge" in line).split()[1])
    tokens = gen.generate(list(range(1, 17)), 8, stop_at_eos=False).tokens
    return {"load_s": load_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "anon_huge_pages_mb": huge_kb / 1024, "tokens": list(tokens)}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench" / "results" / "2026-12-05-huge-pages"))
    import ab  # the separate-process loop, one library after the other in each round

    raise SystemExit(ab.main(child, __file__, __doc__))
