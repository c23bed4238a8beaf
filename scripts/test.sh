#!/usr/bin/env bash
# The test command (README): installs what only the tests need, then runs the suite.
# onnxruntime-genai is the reference the tests compare against; it is installed with --no-deps
# because its dependency on the CPU `onnxruntime` wheel would clobber onnxruntime-gpu (both install
# the `onnxruntime` module). torch + transformers are optional: the tests that build a random
# Hugging Face checkpoint skip, saying so, where they are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "pytest>=8"
python -c "import onnxruntime_genai" 2>/dev/null || python -m pip install -q --no-deps "onnxruntime-genai==0.18.0"
python -m pytest -q "$@"
