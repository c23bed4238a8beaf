"""Greedy acceptance of a folder's MTP head, measured teacher-forced with ONNX Runtime (CPU EP).

For each prompt: the target decodes greedily with its KV/conv/recurrent caches, keeping the
hidden state of every position; then the head runs once over the whole sequence of pairs
(token t_{i+1}, hidden h_i) at position i -- what onnxruntime-genai's MtpGenerator feeds it -- and
its argmax at pair i is the draft for t_{i+2}. Acceptance = the fraction of generated tokens
(after the first) whose draft equals the target's greedy token: the k=1 acceptance rate.

A random model's greedy output can fall into a short cycle (likely with a small vocabulary: the
tiny preset does within ~50 tokens); inside a cycle the head is trivially right, so the result
also gives where each stream became periodic and the acceptance before that point.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class AcceptanceError(ValueError):
    """A measurement option out of range (the command line prints it as one line)."""


def check_options(prompts: int, prompt_length: int, new_tokens: int, seed: int,
                  context_length: int | None = None) -> None:
    """Refuses options the measurement cannot run with. `new_tokens` >= 2: the first generated token has
    no draft from a generated context, so one token gives no trial. The target reads positions up to
    prompt_length + new_tokens - 2 (the last token is not fed back), which must be inside the context."""
    for name, value, least in (("prompts", prompts, 1), ("prompt length", prompt_length, 1),
                               ("new tokens", new_tokens, 2), ("seed", seed, 0)):
        if value < least:
            raise AcceptanceError(f"{name} must be at least {least}, got {value}")
    if context_length is not None and prompt_length + new_tokens - 1 > context_length:
        raise AcceptanceError(f"a {prompt_length}-token prompt and {new_tokens} new tokens exceed the context length "
                              f"{context_length} (at most {context_length + 1 - prompt_length} new tokens fit)")


class Session:
    """A raw ORT CPU session of model.onnx or mtp.onnx with zero-initialised past inputs."""

    def __init__(self, path: Path, head_size: int):
        self.head_size = head_size  # fills the symbolic kv_cache_dim of the past KV inputs
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def empty_past(self) -> dict[str, np.ndarray]:
        past = {}
        for name, info in self.inputs.items():
            if name.startswith(("past_key_values.", "past.")):
                dims = [1 if d == "batch_size" else 0 if d == "past_sequence_length" else d for d in info.shape]
                if "kv_cache_dim" in dims:
                    dims[dims.index("kv_cache_dim")] = self.head_size
                past[name] = np.zeros(dims, _NP[info.type])
        return past

    def run(self, tokens: np.ndarray, start: int, past: dict, hidden: np.ndarray | None = None) -> dict:
        seq = tokens.shape[1]
        feeds = dict(past)
        feeds["input_ids"] = tokens.astype(np.int64)
        feeds["attention_mask"] = np.ones((1, start + seq), np.int64)
        feeds["position_ids"] = np.tile(np.arange(start, start + seq, dtype=np.int64), (3, 1, 1))
        if hidden is not None:
            feeds["hidden_states"] = hidden
        return dict(zip(self.outputs, self.session.run(None, feeds)))

    @staticmethod
    def next_past(outputs: dict) -> dict:
        past = {}
        for name, value in outputs.items():
            if name.startswith("present."):
                suffix = name[len("present."):]
                key = f"past_key_values.{suffix}" if suffix.endswith((".key", ".value")) else f"past.{suffix}"
                past[key] = value
        return past


def greedy_with_hidden(main: Session, prompt: np.ndarray, new_tokens: int) -> tuple[list[int], np.ndarray]:
    """Greedy decode with caches; returns (all tokens, hidden state of every position but the last)."""
    out = main.run(prompt[None, :], 0, main.empty_past())
    tokens = [int(t) for t in prompt]
    hidden = [out["hidden_states"][0]]
    for step in range(new_tokens):
        token = int(np.argmax(out["logits"][0, -1]))
        tokens.append(token)
        if step == new_tokens - 1:
            break
        out = main.run(np.array([[token]]), len(tokens) - 1, Session.next_past(out))
        hidden.append(out["hidden_states"][0])
    return tokens, np.concatenate(hidden, axis=0)


def _require_cpu_runnable(folder: Path) -> None:
    import onnx

    from .config import ConfigError

    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    for value in graph.input:
        if value.name.endswith(".recurrent") and len(value.type.tensor_type.shape.dim) == 5:
            raise ConfigError(f"{folder} has a state window (CUDA-only in ONNX Runtime): measure a build without --state-window")


def periodic_from(tokens: list[int]) -> int | None:
    """Index from which `tokens` repeat with some period p up to the end, if that tail holds at
    least three periods and 12 tokens; else None."""
    n = len(tokens)
    for period in range(1, n // 3 + 1):
        if tokens[n - 3 * period : n - 2 * period] == tokens[n - 2 * period : n - period] == tokens[n - period :]:
            start = n - 3 * period
            while start > 0 and tokens[start - 1] == tokens[start - 1 + period]:
                start -= 1
            if n - start >= 12:
                return start
    return None


def measure_folder(folder: str | Path, prompts: int = 4, prompt_length: int = 32, new_tokens: int = 64,
                   seed: int = 0) -> dict:
    folder = Path(folder)
    if not (folder / "genai_config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a model folder (no genai_config.json)")
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    check_options(prompts, prompt_length, new_tokens, seed, config["context_length"])
    head_size = config["decoder"]["head_size"]
    _require_cpu_runnable(folder)
    main, head = Session(folder / "model.onnx", head_size), Session(folder / "mtp.onnx", head_size)
    specials = set(config["eos_token_id"]) | {config["pad_token_id"], config["bos_token_id"]}
    rng = np.random.default_rng(seed)
    per_prompt = []
    for _ in range(prompts):
        prompt = rng.integers(256, min(config["vocab_size"], min(specials)), size=prompt_length)
        tokens, hidden = greedy_with_hidden(main, prompt, new_tokens)
        pairs = len(tokens) - 1  # pair i = (token t_{i+1}, hidden h_i)
        dtype = _NP[head.inputs["hidden_states"].type]
        out = head.run(np.array([tokens[1:]]), 0, head.empty_past(), hidden[None, :pairs].astype(dtype))
        drafts = np.argmax(out["logits"][0], axis=-1)  # drafts[i] predicts t_{i+2}
        first = prompt_length + 1  # the first generated token with a draft from a generated context
        hit = [int(drafts[j - 2] == tokens[j]) for j in range(first, len(tokens))]
        cycle = periodic_from(tokens[prompt_length:])
        before = hit if cycle is None else hit[: max(0, cycle - 1)]
        finite = bool(np.isfinite(out["logits"]).all() and np.isfinite(hidden).all())
        per_prompt.append({
            "accepted": sum(hit), "trials": len(hit), "acceptance": sum(hit) / len(hit),
            "cycle_start": cycle, "accepted_before_cycle": sum(before), "trials_before_cycle": len(before),
            "finite": finite,
        })
    accepted = sum(p["accepted"] for p in per_prompt)
    trials = sum(p["trials"] for p in per_prompt)
    before_hits = sum(p["accepted_before_cycle"] for p in per_prompt)
    before_trials = sum(p["trials_before_cycle"] for p in per_prompt)
    return {
        "folder": str(folder),
        "acceptance": accepted / trials,
        "accepted": accepted,
        "trials": trials,
        "acceptance_before_cycle": before_hits / before_trials if before_trials else None,
        "prompts_with_cycle": sum(p["cycle_start"] is not None for p in per_prompt),
        "finite": all(p["finite"] for p in per_prompt),
        "prompts": per_prompt,
        "prompt_length": prompt_length,
        "new_tokens": new_tokens,
        "seed": seed,
    }


def sweep(preset_name: str, noises: list[float], precision: str = "int4", out_scale: float | None = None,
          prompts: int = 4, prompt_length: int = 32, new_tokens: int = 64, seed: int = 0) -> dict:
    """Builds the preset (CPU) once per knob value into a temporary folder and measures each."""
    import tempfile

    from .build import build
    from .config import BuildOptions, Synthesis, preset

    rows = []
    for noise in noises:
        synthesis = Synthesis(seed=seed, mtp_noise=noise, **({} if out_scale is None else {"out_scale": out_scale}))
        with tempfile.TemporaryDirectory(prefix="models-sweep-") as tmp:
            build(preset(preset_name), tmp, BuildOptions(precision=precision, ep="cpu", synthesis=synthesis))
            result = measure_folder(tmp, prompts=prompts, prompt_length=prompt_length, new_tokens=new_tokens, seed=seed)
        result.pop("folder")
        rows.append({"mtp_noise": noise, "out_scale": synthesis.out_scale, **result})
    return {"preset": preset_name, "precision": precision, "rows": rows}


def markdown_table(result: dict) -> str:
    lines = [
        "| mtp_noise | acceptance | before any cycle | prompts that cycled | all finite |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        before = row["acceptance_before_cycle"]
        lines.append(
            f"| {row['mtp_noise']:g} | {row['acceptance']:.3f} ({row['accepted']}/{row['trials']}) | "
            f"{'-' if before is None else f'{before:.3f}'} | {row['prompts_with_cycle']}/{len(row['prompts'])} | {row['finite']} |"
        )
    return "\n".join(lines)
