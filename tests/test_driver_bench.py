"""The device checks' logic, dry-run on the CPU EP so that it is tested here, without a GPU:
bench/driver_cuda_check.py (the driver's CUDA path), and the GPU check groups of tests/gpu (the
kernels' checks: a group end to end in its own process, each MatMulNBits check on small cases, and
the failure messages a crash, a failing case and a compute-sanitizer report give)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))  # the GPU groups' modules (tests/gpu has no __init__.py)

import cases_matmul  # noqa: E402
from group_process import GroupResult, Options, judge, run_group  # noqa: E402
from groups import GROUPS  # noqa: E402
from harness import Context  # noqa: E402

from driver.device import make_device  # noqa: E402


def test_e2e_script_dry_run(tiny_folder, tmp_path):
    """bench/e2e_27b.py on the CPU EP and the tiny preset: every mode's row has the fields the device run
    reports (medians over repetitions, time to first token, weight bandwidth, phases; the command, date
    and revision), and MTP's streams
    equal greedy's; an `ours_no<kind>` configuration runs every rewrite but that one."""
    import os

    done = subprocess.run([sys.executable, str(REPO / "bench" / "e2e_27b.py"), "--provider", "cpu", "--folder",
                           str(tiny_folder), "--configurations", "ours,ours_nomlp", "--prompts", "2", "--new-tokens", "6",
                           "--repetitions", "2", "--phases", "--skip-identity"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "e2e_27b.json").read_text())
    assert report["command"].startswith("bench/e2e_27b.py --provider cpu") and report["date"] and report["revision"]
    ours, without = report["configurations"]
    assert ours["mtp_session_state_window"] == 5  # the tiny folder has none: k = 4 + 1 slots in memory
    assert without["label"] == "ours_nomlp" and "mlp" not in without["rewrite"]
    assert ours["rewritten"]["mlp"] > 0 and without["rewritten"]["mlp"] == 0
    assert without["rewritten"]["matmul_nbits"] == ours["rewritten"]["matmul_nbits"] > 0
    assert ours["repetitions"] == 2 and ours["weight_bytes"]["main"] > 0
    # each Generator's own memory (here resident memory: the CPU EP), not the two together
    memory = ours["memory_bytes"]
    assert memory["mtp_generator"] > 0 and memory["peak_both"] >= memory["mtp_generator"] + memory["greedy_generator"]
    assert set(ours["modes"]) == {"greedy", "mtp_k1", "mtp_k2", "mtp_k3", "mtp_k4"}
    for name, row in ours["modes"].items():
        assert row["ttft_ms_median"] > 0 and row["weight_gb_s_median"] > 0
        assert name == "greedy" or "round" in row["phase_ms_per_round"]  # greedy has no rounds to time
        for entry in row["prompts"]:
            assert len(entry["tok_s_runs"]) == 2 and len(entry["tokens"]) == 6
            if name != "greedy":
                assert entry["first_difference_from_greedy"] is None


@pytest.mark.parametrize("knob", [["--mtp-noise", "0"], ["--out-scale", "0.01"]])
def test_e2e_script_refuses_a_knob_for_an_existing_folder(tiny_folder, tmp_path, knob):
    """--mtp-noise and --out-scale apply to a folder the run builds: an existing folder does not record the
    knobs it was built with, so the run stops, naming the folder, before timing anything under knobs it may
    not have."""
    import os

    done = subprocess.run([sys.executable, str(REPO / "bench" / "e2e_27b.py"), "--provider", "cpu", "--folder",
                           str(tiny_folder), *knob, "--configurations", "ours"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode != 0
    assert f"{knob[0]} {knob[1]}: {tiny_folder} already exists" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "e2e_27b.json").exists()


def test_e2e_script_counts_genai_acceptance_as_ours(tmp_path):
    """onnxruntime-genai's MtpGenerator on a CPU fp16 folder through bench/e2e_27b.py: its acceptance is
    accepted / drafted, as our rows count it, beside genai's own acceptance_rate (accepted / drafts
    compared, which stop at a round's first mismatch): equal at k = 1, never above it at k >= 2."""
    import os

    pytest.importorskip("onnxruntime_genai")
    from models.build import build
    from models.config import BuildOptions, preset

    folder = tmp_path / "tiny_fp16"
    build(preset("tiny"), folder, BuildOptions(precision="fp16", ep="cpu"))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "e2e_27b.py"), "--provider", "cpu", "--folder",
                           str(folder), "--configurations", "genai", "--prompts", "2", "--new-tokens", "24",
                           "--skip-identity"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    genai = json.loads((tmp_path / "e2e_27b.json").read_text())["genai"]
    assert genai["acceptance"] == "accepted / drafted"
    below = 0
    for name, row in genai["modes"].items():
        for entry in row["prompts"] if name != "greedy" else []:
            ours, theirs = entry["acceptance"], entry["genai_acceptance_rate"]
            if name == "mtp_k1":
                assert ours == pytest.approx(theirs, abs=1e-6)  # every draft is compared
            else:
                assert ours <= theirs + 1e-6
                below += ours < theirs - 1e-6
    assert below > 0  # some round stopped at a mismatch before its last draft


def test_kernel_profile_phase_attribution():
    """bench/kernel_profile_27b.py gives each kernel to the phase range that holds its start (ranges
    sorted or not), and to "outside phases" when none does."""
    sys.path.insert(0, str(REPO / "bench"))
    from kernel_profile_27b import assign_to_ranges

    ranges = [("verify", 20.0, 30.0), ("draft", 0.0, 10.0)]
    kernels = [("gemv", 1.0, 4.0), ("gemv", 9.5, 2.0), ("argmax", 10.5, 1.0), ("gemv", 25.0, 3.0), ("gemv", 30.0, 1.0),
               ("copy", 31.0, 0.5), ("early", -1.0, 0.5)]
    out, busy = assign_to_ranges(ranges, kernels)
    assert dict(out["draft"]) == {"gemv": [6.0, 2]}
    assert dict(out["verify"]) == {"gemv": [4.0, 2]}
    assert dict(out["outside phases"]) == {"argmax": [1.0, 1], "copy": [0.5, 1], "early": [0.5, 1]}
    assert busy == {"draft": 6.0, "verify": 4.0, "outside phases": 2.0}


def test_kernel_profile_busy_time_counts_overlaps_once():
    """busy_us is the union of the kernels' spans: a kernel that starts before the one ahead of it ends
    (programmatic dependent launch) adds only what sticks out, one inside another adds nothing, gaps
    add nothing, and the order the spans come in does not matter."""
    sys.path.insert(0, str(REPO / "bench"))
    from kernel_profile_27b import assign_to_ranges, busy_us

    spans = [(10.0, 5.0), (0.0, 4.0), (3.0, 2.0), (11.0, 1.0), (20.0, 1.0)]  # 0-5, 10-15, 20-21
    assert busy_us(spans) == 11.0
    assert busy_us([]) == 0.0
    out, busy = assign_to_ranges([("verify", 0.0, 30.0)], [("k", s, us) for s, us in spans])
    assert out["verify"]["k"] == [13.0, 5] and busy["verify"] == 11.0


def test_kernel_profile_script_dry_run(tiny_folder, tmp_path):
    """bench/kernel_profile_27b.py on the CPU EP (no kernels to record): the phase ranges are recorded
    around the driver's phases and the JSON has each phase's wall time per round."""
    import os

    pytest.importorskip("torch", reason="the script profiles with torch.profiler")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "kernel_profile_27b.py"), "--provider", "cpu",
                           "--folder", str(tiny_folder), "--new-tokens", "8"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "kernel_profile_27b.json").read_text())
    assert [r["mode"] for r in report["runs"]] == ["greedy", "mtp"]
    phases = report["phases"]
    assert phases["rounds"] > 0 and phases["phase_ranges"] >= 3 * phases["rounds"]  # draft, verify, accept each round
    for name in ("draft", "verify", "accept"):
        assert phases["phases"][name]["wall_ms_per_round"] > 0 and phases["phases"][name]["kernels_per_round"] == 0
    assert "kernel_ms_per_round" not in phases["phases"]["round"]


def test_graph_or_eager_measures_eagerly_where_capture_is_refused():
    """bench/gpu_timing.graph_or_eager, the GPU benchmarks' retry: on CUDA a measurement that raises
    under ORT's CUDA graph is taken again eagerly, saying why; eagerly (the CPU) an error is the error."""
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_timing import graph_or_eager

    tried = []

    def refused_under_graph(graph):
        tried.append(graph)
        if graph:
            raise RuntimeError("capture refused")
        return {"us": 1.0}

    cuda, cpu = type("Cuda", (), {"name": "cuda"})(), type("Cpu", (), {"name": "cpu"})()
    assert graph_or_eager(cuda, refused_under_graph) == {"us": 1.0, "cuda_graph": False,
                                                        "cuda_graph_error": "RuntimeError: capture refused"}
    assert tried == [True, False]
    assert graph_or_eager(cuda, lambda graph: {"us": 2.0}) == {"us": 2.0, "cuda_graph": True}
    with pytest.raises(RuntimeError, match="capture refused"):
        graph_or_eager(cpu, lambda graph: refused_under_graph(True))


def test_group_query_attention_bench_dry_run(tmp_path):
    """bench/group_query_attention.py on the CPU EP (tiny shapes): every case is timed for both
    implementations, and our op's output agrees with ORT's node on the same inputs."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "group_query_attention.py"), "--cpu-dry-run",
                           "--reps", "3", "--calls", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "group_query_attention.json").read_text())
    assert report["errors"] == []
    table = report["table_us"]
    assert {"S=1", "S=8", "S=16"} <= set(table) and any(name.startswith("prefill") for name in table)
    for name, row in table.items():
        assert row["ours"] > 0 and row["ort"] > 0, name
        assert row["output_max_diff_over_max_ort"] < 1e-3, (name, row)


def test_float_matmul_bench_dry_run(tmp_path):
    """bench/float_matmul.py on the CPU EP (small shapes): every row count is timed for both
    implementations, and our op's output agrees with ORT's MatMul on the same inputs."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "float_matmul.py"), "--cpu-dry-run",
                           "--reps", "3", "--calls", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "float_matmul.json").read_text())
    assert report["errors"] == []
    table = report["table_us"]
    assert {"M=1", "M=2", "M=4", "M=32"} == set(table)
    for name, row in table.items():
        assert row["ours"] > 0 and row["ort"] > 0 and row["ours_ab"] > 0, name
        assert row["ours_ab_over_two_ours"] > 0, name
        assert row["output_max_diff_over_max_ort"] < 2e-3, (name, row)


def test_device_script_dry_run(tmp_path):
    """The models presets only: the onnxruntime-genai fixtures come from `prepare` (torch), and a
    missing one is reported, not fatal."""
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "driver_cuda_check.py"), "run", "--provider", "cpu",
                           "--presets", "tiny", "--prompts", "2", "--new-tokens", "8", "--fixtures", str(fixtures),
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "driver_cpu_check.json").read_text())
    assert set(report["folders"]) == {"tiny", "genai-cpu"}
    assert "not found" in report["folders"]["genai-cpu"]["error"]
    for label, folder in report["folders"].items():
        if label == "genai-cpu":
            continue
        eager = folder["eager"]
        assert "error" not in eager, eager
        for name in ("mtp_k1", "mtp_k2", "mtp_k3", "mtp_k3_replay"):
            assert eager[name]["equal_greedy"] == [True, True], (label, name)
        # the CPU folders are exported without a window; with commit=replay the driver adds none in memory
        assert eager["mtp_k3_replay"]["commits"].get("promote", 0) == 0
    assert report["ort_log"]["tiny"]["returncode"] == 0
    assert "error" not in report["identity"]["tiny"]
    assert report["identity"]["tiny"]["ort_mtp"]["origins"] == []  # every op row-consistent on CPU
    assert "tiny [eager]" in done.stdout
    # driver.shared_weights' check runs on the CPU EP too (its Gather reads the copy in place there as well)
    assert report["shared_weights"]["in_place"] is True and report["shared_weights"]["equal_before"] is True
    assert "read in place by both sessions True" in done.stdout


def test_gpu_check_group_dry_run(tmp_path):
    """A group as tests/gpu runs it, on the CPU EP: its own process (worker.py), its JSON result, the
    verdict (CopySlots: 11 cases, the CUDA-graph one eager here)."""
    result = run_group("copy_slots", Options(logs=tmp_path, provider="cpu", seed=1, timeout=120))
    assert result.ok, result.failure_message()
    assert [r["ok"] for r in result.records] == [True] * 11
    assert result.report["info"]["device"] == "cpu" and result.report["finished"]
    assert "promote in place slot 3->3" in (tmp_path / "copy_slots.log").read_text()


def test_gpu_matmul_checks_dry_run():
    """Each MatMulNBits check on one or two small cases on the CPU EP (there the op under test and the
    reference op are the same kernel, so this tests the checks, not the kernels)."""
    ctx = Context(make_device("cpu"), np.random.default_rng(0), random_cases=0)
    small = [("float16", 256, 40, 4, 32, "packed", True), ("bfloat16", 96, 31, 4, 32, None, False)]
    tiles = [("bfloat16", 256, 32, 4, 64, None, True)]
    checks = {"smoke": cases_matmul.check_smoke(ctx, small), "smoke tiles": cases_matmul.check_smoke(ctx, tiles, True),
              "matmul": cases_matmul.check_matmul(ctx, coverage=small[1:]),
              "decode": cases_matmul.check_decode_consistency(ctx, small[:1]),
              "graph": cases_matmul.check_graph(ctx, [("float32", 64, 24, 32, None)])}
    for name, records in checks.items():
        records = list(records)
        assert records and all(r["ok"] and r["problem"] is None and r["case"] for r in records), (name, records)
    assert cases_matmul.expected_path("float16", 4, 32, None, 5120, 17408).startswith("mma(")


SANITIZER_LOG = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at void gemv::GemvStreamKernel<__half, 32>(gemv::Params)+0x1a0
=========     by thread (5,0,0) in block (3,0,0)
=========     Address 0x7f00 is out of bounds
=========
========= ERROR SUMMARY: 2 errors
"""


def test_gpu_check_failure_messages_name_the_cause(tmp_path):
    """What a failing group's test prints: the failing case with its kernel path, a sanitizer report,
    the case a dead worker was running, and the command that reruns the group."""
    log = tmp_path / "smoke-mma.log"
    log.write_text("ok   case a\n" + SANITIZER_LOG)
    bad = {"case": "float16 K=512 N=200 bits=4 block=32 zp=none bias", "ok": False, "path": "mma(kc=256)+pdl",
           "problem": "M=17: error/tolerance 3.2, unwritten 0"}
    report = {"finished": True, "running": None, "records": [{"case": "case a", "ok": True}, bad]}
    options = Options(logs=tmp_path, seed=7, sanitizer="memcheck")
    result = judge(GroupResult(GROUPS["smoke-mma"], options, 1, 1.0, report, log))
    message = result.failure_message()
    assert not result.ok
    assert "float16 K=512 N=200 bits=4 block=32 zp=none bias [mma(kc=256)+pdl]: M=17: error/tolerance 3.2" in message
    assert "compute-sanitizer memcheck reported 2 error(s); first: Invalid __global__ read of size 16 bytes" in message
    assert "exit status" not in message  # status 1 is the tool's here, not the worker's
    assert "compute-sanitizer --tool memcheck python tests/gpu/worker.py --group smoke-mma" in message
    assert "--seed 7" in message

    crashed = {"finished": False, "running": "bfloat16 K=96 N=31", "records": [{"case": "case a", "ok": True}]}
    result = judge(GroupResult(GROUPS["smoke-plain"], Options(logs=tmp_path, seed=7), -11, 1.0, crashed, log))
    assert not result.ok
    assert "died of signal 11 while running case 'bfloat16 K=96 N=31'" in result.failure_message()
    assert "ORT_MTP_GEMV_PDL=0 python tests/gpu/worker.py --group smoke-plain" in result.failure_message()

    # A clean run under the sanitizer must show the tool's summary, else the tool never ran.
    clean = {"finished": True, "running": None, "records": [{"case": "case a", "ok": True}]}
    log.write_text("ok   case a\n")
    result = judge(GroupResult(GROUPS["smoke-mma"], options, 0, 1.0, clean, log))
    assert result.failures == ["compute-sanitizer memcheck printed no error summary"]
    log.write_text("ok   case a\n========= ERROR SUMMARY: 0 errors\n")
    assert judge(GroupResult(GROUPS["smoke-mma"], options, 0, 1.0, clean, log)).ok

    result = judge(GroupResult(GROUPS["copy_slots"], Options(logs=tmp_path), 1, 1.0, {}, log))
    assert {"the worker ended with exit status 1", "the worker wrote no result"} <= set(result.failures)
