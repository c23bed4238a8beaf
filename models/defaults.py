"""Where the models package keeps the model the driver uses when given none."""

from pathlib import Path

# The trained default: a ~12M-parameter Qwen3.5-architecture model with its MTP head, trained here on
# Python source (models/train), exported through onnxruntime-genai's builder for the CPU (int4).
# models/data/trained/PROVENANCE.md says how it was made.
TRAINED_FOLDER = Path(__file__).parent / "data" / "trained"
