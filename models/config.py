"""Shapes of the synthetic Qwen3.5-class models and the options of one build.

The field names follow Hugging Face's `Qwen3_5TextConfig`, so a preset reads like the text config of
the checkpoint it imitates and `hf_checkpoint.py` can turn one into a real random checkpoint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

PRECISIONS = ("int4", "fp16", "fp32")
EPS = ("cpu", "cuda")


class ConfigError(ValueError):
    """A preset, option or shape that cannot be built (the CLI prints it as one line)."""


@dataclass(frozen=True)
class Qwen35Shape:
    """Shapes of a dense Qwen3.5 text model with one MTP layer (model_type qwen3_5_text)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    vocab_size: int
    context_length: int
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4  # every 4th layer is full attention, the rest Gated DeltaNet
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    rms_norm_eps: float = 1e-6
    block_size: int = 32  # int4 quantization block (MatMulNBits block_size)

    # --- derived sizes, named as the builder names them ---
    @property
    def layer_types(self) -> list[str]:
        interval = self.full_attention_interval
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def validate(self) -> None:
        """Raises ConfigError naming the first shape the graph or the ORT kernels cannot take."""
        positive = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.type == "int"}
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{key} must be positive, got {value}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_hidden_layers < self.full_attention_interval:
            raise ConfigError("num_hidden_layers must include at least one full-attention layer")
        if self.rotary_dim % 2 or sum(self.mrope_section) != self.rotary_dim // 2:
            raise ConfigError(
                f"mrope_section {list(self.mrope_section)} must sum to rotary_dim/2 = {self.rotary_dim // 2}"
            )
        # Every int4 matrix has K (its input width) a whole number of blocks: the builder would pad,
        # we simply refuse shapes where padding would be needed.
        for key, k in {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads*head_dim": self.q_size,
            "linear value dim": self.linear_value_dim,
        }.items():
            if k % self.block_size:
                raise ConfigError(f"{key} = {k} must be a multiple of the int4 block size {self.block_size}")


PRESETS: dict[str, Qwen35Shape] = {
    # A few MB, builds in about a second: for CPU tests. Two full-attention layers so the KV path
    # of a later layer is exercised too.
    "tiny": Qwen35Shape(
        name="tiny",
        hidden_size=128,
        num_hidden_layers=8,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        vocab_size=8192,
        context_length=4096,
        mrope_section=(2, 1, 1),
    ),
    # A few hundred million parameters (~0.4 B): CPU acceptance measurements, GPU smoke runs.
    "small": Qwen35Shape(
        name="small",
        hidden_size=1024,
        num_hidden_layers=24,
        intermediate_size=3072,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        linear_num_key_heads=8,
        linear_num_value_heads=16,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        vocab_size=32768,
        context_length=8192,
        mrope_section=(6, 5, 5),
    ),
    # The shape of the 4B-class checkpoint measured with onnxruntime-genai before this project (docs/models.md);
    # context 32768 as a checkpoint made from transformers' default Qwen3_5TextConfig has.
    "qwen35-4b": Qwen35Shape(
        name="qwen35-4b",
        hidden_size=2560,
        num_hidden_layers=32,
        intermediate_size=9216,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        vocab_size=248320,
        context_length=32768,
    ),
    # Qwen3.5-27B shapes: 64 layers (every 4th full attention with the output gate), vocab 248320,
    # its 262144-token context (genai_config's default max_length: pass a smaller one to a runtime).
    "qwen35-27b": Qwen35Shape(
        name="qwen35-27b",
        hidden_size=5120,
        num_hidden_layers=64,
        intermediate_size=17408,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        vocab_size=248320,
        context_length=262144,
    ),
}


@dataclass(frozen=True)
class Synthesis:
    """How the synthetic weights are drawn (see weights.py for why each choice)."""

    seed: int = 0
    # Scale of every output projection (o_proj, down_proj, linear-attention out_proj) relative to
    # 1/sqrt(fan_in): small, so the residual stream stays close to the token embedding.
    out_scale: float = 0.02
    # The MTP head's fc is [identity | N(0, mtp_noise/sqrt(H))]: the noise-to-signal ratio of the
    # head's input. 0 = the head sees only the embedding of the token it is given; larger = less
    # predictive. This is the acceptance knob (docs/models.md has the measured table).
    mtp_noise: float = 0.1
    # Relative jitter of RMSNorm weights that are off the embedding -> logits path.
    norm_jitter: float = 0.1

    def validate(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be in [0, 2**63), got {self.seed}")
        if not 0 < self.out_scale <= 1:
            raise ConfigError(f"out_scale must be in (0, 1], got {self.out_scale}")
        if not 0 <= self.mtp_noise <= 100:
            raise ConfigError(f"mtp_noise must be in [0, 100], got {self.mtp_noise}")
        if not 0 <= self.norm_jitter < 1:
            raise ConfigError(f"norm_jitter must be in [0, 1), got {self.norm_jitter}")


@dataclass(frozen=True)
class BuildOptions:
    """Target of one build: what onnxruntime-genai's builder takes as -p / -e / state_window."""

    precision: str = "int4"
    ep: str = "cpu"
    state_window: int = 0
    synthesis: Synthesis = field(default_factory=Synthesis)

    def validate(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.ep not in EPS:
            raise ConfigError(f"ep must be one of {', '.join(EPS)}, got {self.ep!r}")
        from ops.state_window import window_out_of_range

        if why := window_out_of_range(self.state_window):
            raise ConfigError(why)
        # state_window on the CPU EP: ORT's CPU CausalConvWithState/LinearAttention reject it at load
        # time, so such a folder runs only on ort_mtp::GatedDeltaNet (the driver's default rewrite, or
        # `python -m ops rewrite` for onnxruntime-genai). It spares MTP its re-advance forwards there.
        self.synthesis.validate()

    # --- the dtype rules of onnxruntime-genai's builder ---
    # One deliberate exception: for fp16 on CPU the builder emits MultiHeadAttention (with its own
    # mask subgraph) instead of GroupQueryAttention; we keep the CUDA fp16 graph, which ORT's CPU EP
    # runs, so an fp16 CPU folder is the CUDA fp16 folder with a CPU genai_config (onnxruntime-genai
    # 0.18's MtpGenerator needs fp16 hidden states, so this is the folder it runs on CPU).
    @property
    def io_dtype(self) -> str:
        """Activation/KV/state dtype: fp32 for fp32 and for int4 on CPU, else fp16."""
        if self.precision == "fp32" or (self.precision == "int4" and self.ep == "cpu"):
            return "fp32"
        return "fp16"

    @property
    def int4_accuracy_level(self) -> int | None:
        """The builder writes accuracy_level=4 (int8 activations) for CPU int4, nothing for CUDA."""
        return 4 if self.ep == "cpu" else None

    @property
    def shares_initializers(self) -> bool:
        """Whether genai_config lists shared_initializers: onnxruntime-genai 0.18 refuses them on
        CPU ("GetMemoryInfo for CPU should not be used"), so CPU builds leave them out. The ONNX
        files are the same either way (mtp.onnx reads the shared tensors from model.onnx.data)."""
        return self.ep != "cpu"


def preset(name: str) -> Qwen35Shape:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})") from None
