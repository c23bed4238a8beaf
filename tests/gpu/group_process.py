"""One GPU check group in its own process: the command (worker.py), compute-sanitizer around it, the
time limit, and the result read back as one verdict whose failure message names the failing cases.

The worker runs in a new session (process group): compute-sanitizer starts the worker as its own
child, and killing the group on a time-out or an interrupt leaves nothing running on the GPU.
GroupPool runs several groups at a time (their processes share the one GPU; most of a group's time is
host work: reference sums, process start) and hands each test its group's result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from groups import GROUPS, Group
from harness import ENV_KEYS

WORKER = Path(__file__).with_name("worker.py")
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
SANITIZER_EXIT = 1  # compute-sanitizer --error-exitcode: the tool found an error
MAX_LISTED = 12     # failing cases listed in a failure message


@dataclass
class Options:
    """How the groups run (the pytest options of tests/gpu/conftest.py)."""

    logs: Path | None = None        # <group>.log (the process's output), <group>.json (its result);
                                    # None: a new temporary folder, made when the first group runs
    provider: str = "cuda"
    seed: int = 0
    random_cases: int = 24
    timeout: int = 600              # seconds one group may take
    sanitizer: str | None = None    # a compute-sanitizer tool
    sanitizer_path: str | None = None


def find_sanitizer(explicit: str | None = None) -> str | None:
    """compute-sanitizer: `explicit`, else on PATH, else $CUDA_HOME/bin (default /usr/local/cuda)."""
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    candidate = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer"
    return str(candidate) if candidate.is_file() else None


def sanitizer_prefix(tool: str, explicit: str | None = None) -> list[str]:
    exe = find_sanitizer(explicit)
    if exe is None:
        raise FileNotFoundError("compute-sanitizer not found: put it on PATH, set CUDA_HOME or pass --sanitizer-path")
    # API errors are not reported: ONNX Runtime and cuDNN make calls that fail by design (probing), and
    # only our kernels are under test here.
    return [exe, "--tool", tool, "--error-exitcode", str(SANITIZER_EXIT), "--print-limit", "20",
            "--report-api-errors", "no"]


SANITIZER_LINE = re.compile(
    r"^=+ (?!ERROR SUMMARY|COMPUTE-SANITIZER|Program hit|\s*Saved host backtrace|\s+at |\s+Host Frame)(.+)")


def first_sanitizer_error(log: str) -> str | None:
    """The first report of compute-sanitizer in a log (with the next two lines: kernel and place)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = SANITIZER_LINE.match(line)
        if m and re.search(r"Invalid|Error|error|Race|Hazard|hazard|Illegal|Misaligned|Out of bounds|Barrier",
                           m.group(1)):
            extra = [re.sub(r"^=+\s*", "", x).strip() for x in lines[i + 1:i + 3] if x.startswith("=")]
            return " | ".join([m.group(1).strip()] + [x for x in extra if x])[:600]
    return None


def sanitizer_error_count(log: str) -> int | None:
    """Errors compute-sanitizer reported (racecheck counts its hazards apart from the error summary)."""
    counts = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", log)]
    counts += [int(n) for n in re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", log)]
    return sum(counts) if counts else None


# ---------------------------------------------------------------------------------------------------
# Processes

_running: set[subprocess.Popen] = set()  # worker processes now running, each the leader of its group
_running_lock = threading.Lock()


def kill_running() -> None:
    """Kills every running worker's process group (on SIGTERM or an interrupt)."""
    with _running_lock:
        for proc in list(_running):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def interrupt_on_sigterm() -> None:
    """SIGTERM (the device script's `timeout`) kills the running workers and interrupts pytest, which
    then still writes its report (JUnit XML) for the groups that finished."""
    def handler(signum, frame):  # noqa: ARG001
        kill_running()
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def run_in_own_group(cmd: list[str], env: dict, timeout: int, log_path: Path) -> int | None:
    """Runs cmd in a new process group, its output into log_path. Exit status, or None on a time-out."""
    with open(log_path, "w") as log, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                      stdin=subprocess.DEVNULL, start_new_session=True) as proc:
        with _running_lock:
            _running.add(proc)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        except BaseException:  # an interrupt: nothing may stay behind on the GPU
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            with _running_lock:
                _running.discard(proc)


def command(group: Group, options: Options, result_path: Path) -> tuple[list[str], dict]:
    cmd = [sys.executable, str(WORKER), "--group", group.name, "--result", str(result_path),
           "--provider", options.provider, "--seed", str(options.seed), "--random-cases", str(options.random_cases)]
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env.update(group.env)
    env["PYTHONUNBUFFERED"] = "1"
    if options.sanitizer:
        cmd = sanitizer_prefix(options.sanitizer, options.sanitizer_path) + cmd
        if options.sanitizer == "memcheck":
            cmd.append("--no-memory-pool")  # buffers from cudaMalloc one by one: memcheck sees their exact ends
    return cmd, env


def reproduce_command(group: Group, options: Options) -> str:
    env = " ".join(f"{k}={v}" for k, v in group.env.items())
    tool = f"compute-sanitizer --tool {options.sanitizer} " if options.sanitizer else ""
    return (f"{env + ' ' if env else ''}{tool}python tests/gpu/worker.py --group {group.name} "
            f"--provider {options.provider} --seed {options.seed}"
            + (f" --random-cases {options.random_cases}" if group.name == "matmul" else ""))


# ---------------------------------------------------------------------------------------------------
# Results

@dataclass
class GroupResult:
    group: Group
    options: Options
    returncode: int | None          # None: timed out
    seconds: float
    report: dict                    # the worker's result file ({} when it wrote none)
    log_path: Path
    sanitizer_errors: int | None = None
    sanitizer_first_error: str | None = None
    failures: list[str] = field(default_factory=list)  # why the group failed, one line each

    @property
    def records(self) -> list[dict]:
        return self.report.get("records", [])

    @property
    def failed_records(self) -> list[dict]:
        return [r for r in self.records if not r.get("ok")]

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        return (f"group {self.group.name}: {len(self.records)} cases, {len(self.failed_records)} failed, "
                f"{self.seconds:.0f} s, exit status {self.returncode}")

    def failure_message(self) -> str:
        """Names the group, its environment and seed, every failing case (up to MAX_LISTED), what the
        sanitizer found, how the process ended, its log, and the command that reproduces the group."""
        env = " ".join(f"{k}={v}" for k, v in self.group.env.items())
        bad = self.failed_records
        first = f"; first failing case: {bad[0].get('case')}: {bad[0].get('problem')}" if bad else ""
        lines = [f"{self.group.name}: {'; '.join(self.failures)}{first}"[:1000],
                 f"  group {self.group.name!r}: {self.group.what}",
                 f"  seed {self.options.seed}" + (f", {env}" if env else "")
                 + (f", under compute-sanitizer --tool {self.options.sanitizer}" if self.options.sanitizer else "")
                 + (f", on the CPU EP" if self.options.provider == "cpu" else "")]
        if bad:
            lines.append(f"  failing cases ({len(bad)} of {len(self.records)}):")
            for r in bad[:MAX_LISTED]:
                path = f" [{r['path']}]" if r.get("path") else ""
                lines.append(f"    {r.get('case')}{path}: {r.get('problem')}")
                if r.get("reproduce"):
                    lines.append(f"      reproduce: {r['reproduce']}")
                if r.get("traceback"):
                    lines.append("      " + r["traceback"].strip().splitlines()[-1][:300])
            if len(bad) > MAX_LISTED:
                lines.append(f"    ... and {len(bad) - MAX_LISTED} more (all in {self.log_path.with_suffix('.json')})")
        tail = [x for x in self.log_text().strip().splitlines() if x.strip()][-6:]
        if tail and (self.returncode != 0 or not self.records):
            lines.append("  last lines of the log:")
            lines += [f"    {x[:300]}" for x in tail]
        lines.append(f"  log: {self.log_path}")
        lines.append(f"  reproduce the group: {reproduce_command(self.group, self.options)}")
        return "\n".join(lines)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def judge(result: GroupResult) -> GroupResult:
    """Fills result.failures from the process's end, its records and the sanitizer's report."""
    rc, report, opts = result.returncode, result.report, result.options
    running = report.get("running")
    during = f" while running case {running!r}" if running else ""
    sanitizer_found = False
    if opts.sanitizer:
        log = result.log_text()
        result.sanitizer_errors = sanitizer_error_count(log)
        result.sanitizer_first_error = first_sanitizer_error(log)
        # The tool's exit status is 1, as is a Python error's: its error count tells them apart.
        sanitizer_found = (result.sanitizer_errors or 0) > 0 or (rc == SANITIZER_EXIT and report.get("finished"))
    if rc is None:
        result.failures.append(f"timed out after {opts.timeout} s{during}")
    elif rc < 0:
        result.failures.append(f"the worker died of signal {-rc}{during}")
    elif rc != 0 and not (rc == SANITIZER_EXIT and sanitizer_found):
        result.failures.append(f"the worker ended with exit status {rc}{during}")
    if sanitizer_found:
        result.failures.append(f"compute-sanitizer {opts.sanitizer} reported {result.sanitizer_errors} error(s); "
                               f"first: {result.sanitizer_first_error}")
    elif opts.sanitizer and rc == 0 and result.sanitizer_errors is None:
        # No summary: the tool did not run (or did not cover the worker), so "no errors" means nothing.
        result.failures.append(f"compute-sanitizer {opts.sanitizer} printed no error summary")
    if rc is not None and not report:
        result.failures.append("the worker wrote no result")
    elif report and not report.get("finished") and rc == 0:
        result.failures.append("the worker's result is incomplete")
    if report.get("aborted"):
        result.failures.append("an exception ended the group early (its remaining cases did not run)")
    if report and not result.records and not result.failures:
        result.failures.append("the group ran no case")
    if result.failed_records:
        result.failures.append(f"{len(result.failed_records)} of {len(result.records)} cases failed")
    return result


def logs_folder(options: Options) -> Path:
    if options.logs is None:
        options.logs = Path(tempfile.mkdtemp(prefix="ort-mtp-gpu-"))
    options.logs.mkdir(parents=True, exist_ok=True)
    return options.logs


def run_group(name: str, options: Options) -> GroupResult:
    """Runs the group in its own process and judges it."""
    group = GROUPS[name]
    logs_folder(options)
    result_path = options.logs / f"{name}.json"
    log_path = options.logs / f"{name}.log"
    result_path.unlink(missing_ok=True)
    cmd, env = command(group, options, result_path)
    started = time.time()
    rc = run_in_own_group(cmd, env, options.timeout, log_path)
    try:
        report = json.loads(result_path.read_text())
    except (OSError, ValueError):
        report = {}
    return judge(GroupResult(group, options, rc, time.time() - started, report, log_path))


class GroupPool:
    """Runs groups `jobs` at a time. start(names) queues them in that order; result(name) waits for
    a queued group, or runs it now."""

    def __init__(self, options: Options, jobs: int = 1):
        self.options = options
        self.executor = ThreadPoolExecutor(max_workers=jobs) if jobs > 1 else None
        self.futures: dict[str, Future] = {}

    def start(self, names) -> None:
        if self.executor is None:
            return
        logs_folder(self.options)  # made once, before the threads
        for name in names:
            if name not in self.futures:
                self.futures[name] = self.executor.submit(run_group, name, self.options)

    def result(self, name: str) -> GroupResult:
        future = self.futures.get(name)
        return future.result() if future is not None else run_group(name, self.options)

    def close(self) -> None:
        if self.executor is not None:
            for future in self.futures.values():
                future.cancel()
            kill_running()
            self.executor.shutdown(wait=True)
