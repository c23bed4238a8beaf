"""bench/driver_cuda_check.py, the device script, dry-run on the CPU EP so its logic is tested here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
            assert eager[name]["commits"].get("promote", 0) == 0  # no window on the CPU EP
    assert report["ort_log"]["tiny"]["returncode"] == 0
    assert "error" not in report["identity"]["tiny"]
    assert {o["op"] for o in report["identity"]["tiny"]["ort_mtp"]["origins"]} <= {"GroupQueryAttention"}
    assert "tiny [eager]" in done.stdout
