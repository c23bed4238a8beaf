"""Runs one GPU check group in this process and writes its result as JSON.

    python tests/gpu/worker.py --group smoke-mma [--seed 7] [--result out.json] [--provider cpu]

The tests under tests/gpu start it once per group (group_process.py), in the group's kernel-selection
environment and, with --sanitizer, under compute-sanitizer; run by hand it reproduces one group.
The result file is rewritten after every case, and says which case is running, so a process that
dies keeps what ran before and names the case that killed it. A case that fails is recorded, not
raised; an exception ends the group with one failed record naming the case that raised (or
"(setup)"), with its traceback. Exit
status 0 whenever the result was written to the end (the result says whether the cases passed), 2
on a bad call. --provider cpu runs the group's logic on the CPU EP (a dry run: graph capture off).
It is a script rather than `python -m tests.gpu.worker` so that no installed package named `tests`
can shadow the checkout's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the group modules, when imported from elsewhere

import numpy as np  # noqa: E402

from harness import Context, kernel_env  # noqa: E402  (puts the checkout on sys.path)

from driver.device import describe, make_device  # noqa: E402


def run_group(name: str, provider: str, seed: int, random_cases: int = 24, result: Path | None = None,
              memory_pool: bool = True) -> dict:
    """The group's records and where it ran; written to `result` (if given) after every case."""
    from groups import GROUPS

    group = GROUPS[name]
    report = {"group": name, "provider": provider, "seed": seed, "env": kernel_env(), "records": [],
              "running": None, "finished": False}
    started = time.time()

    def save():
        report["seconds"] = round(time.time() - started, 1)
        if result is not None:
            result.write_text(json.dumps(report, indent=1, default=str))

    def mark(label: str):
        report["running"] = label
        save()

    save()
    try:
        device = make_device(provider, graph_capture=False)
        if provider == "cuda" and not memory_pool:
            device.xp.cuda.set_allocator(None)  # every buffer its own cudaMalloc: memcheck sees its exact end
        report["info"] = describe(device)
        ctx = Context(device, np.random.default_rng(seed), random_cases=random_cases, env=report["env"],
                      started=mark)
        with device.active():
            for record in group.run(ctx):
                report["records"].append(record)
                report["running"] = None
                status = "ok  " if record.get("ok") else "FAIL"
                print(f"{status} {record.get('case')}" + ("" if record.get("ok") else f": {record.get('problem')}"),
                      flush=True)
                save()
    except Exception as e:  # noqa: BLE001  (recorded, with its traceback, as the group's failure)
        message = f"{type(e).__name__}: {e}"
        report["records"].append({"case": report["running"] or "(setup)", "ok": False, "problem": message[:2000],
                                  "traceback": traceback.format_exc()[-4000:], "exception": True})
        report["aborted"] = True  # the group's remaining cases did not run
        print(f"FAIL {report['records'][-1]['case']}: {message[:2000]}", flush=True)
    report["running"] = None
    report["finished"] = True
    save()
    return report


def main(argv=None) -> int:
    from groups import GROUPS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", required=True, choices=sorted(GROUPS))
    parser.add_argument("--result", help="JSON result file (default: none, the cases are printed)")
    parser.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random-cases", type=int, default=24, help="random cases of the matmul group")
    parser.add_argument("--no-memory-pool", action="store_true",
                        help="allocate every buffer with cudaMalloc (for compute-sanitizer memcheck)")
    args = parser.parse_args(argv)
    report = run_group(args.group, args.provider, args.seed, args.random_cases,
                       Path(args.result) if args.result else None, memory_pool=not args.no_memory_pool)
    failed = sum(1 for r in report["records"] if not r.get("ok"))
    print(f"{args.group}: {len(report['records'])} cases, {failed} failed, {report['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
