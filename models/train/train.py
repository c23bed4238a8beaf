"""Train a small Qwen3.5 text model and its MTP head on this machine's Python source, resumably.

    python -m models train --out DIR [--shape trained-small] [--minutes 10] [--steps N]

Each call continues from DIR's last checkpoint and stops after --minutes (or at the schedule's last
step), so a long run is a sequence of short ones. DIR holds:

    run.json                                the options, fixed by the first call
    tokenizer.json, tokenizer_config.json   byte-level BPE trained on the training split only
    corpus.json                             every file used, its size and its split
    data/{train,heldout}.npy                the token streams (uint16)
    weights/model-NNNNN.safetensors         the weights in bfloat16, shards under 16 MB (shippable)
    state/                                  float32 weights and optimizer state (for resuming only)
    log.json                                options, and per evaluation: step, tokens seen, train and
                                            held-out loss per token (next token, and the head's t+2),
                                            wall seconds

The loss is next-token cross-entropy plus MTP_WEIGHT times the head's t+2 cross-entropy, the head
reading the target's final normed hidden state (detached: the head learns to read the target, the
target is not bent towards the head). Batches are windows of the training stream at offsets drawn
from a generator seeded by (seed, step), so a resumed run sees what an uninterrupted one would, and
on the same machine computes the same weights (tests/test_models_train.py checks it bitwise).
`export_checkpoint` writes the Hugging Face folder `python -m models convert` turns into ONNX.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import Qwen35Shape
from . import corpus

MTP_WEIGHT = 0.5
SHARD_BYTES = 15 * 1024 * 1024  # tensor bytes per shard: with its header a file stays under 16 MB
EVAL_WINDOWS = 64  # held-out windows per evaluation (fixed: the same every time)

SHAPES = {
    # About 11M parameters (and a 1M head): 6 Gated DeltaNet + 2 gated attention layers (3:1), untied
    # embedding and lm_head.
    "trained-small": Qwen35Shape(
        name="trained-small", hidden_size=256, num_hidden_layers=8, intermediate_size=768,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=4,
        linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32, vocab_size=8192,
        context_length=4096, mrope_section=(4, 2, 2)),
    # A few hundred thousand parameters, for the tests.
    "train-test": Qwen35Shape(
        name="train-test", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=512,
        context_length=512, mrope_section=(2, 1, 1)),
}


class TrainError(ValueError):
    """A user-facing problem with the options or the folder (one line)."""


@dataclass
class TrainOptions:
    shape: str = "trained-small"
    seq_len: int = 256
    batch: int = 16
    lr: float = 2e-3
    warmup_steps: int = 200
    total_steps: int = 20_000
    eval_every: int = 200
    seed: int = 0
    corpus_bytes: int | None = None  # None: every file; else a prefix of that many bytes (tests)
    threads: int | None = None


def _special_ids(vocab_size: int):
    from ..tokenizer import SpecialIds

    return SpecialIds(vocab_size - 3, vocab_size - 2, vocab_size - 1)  # the tokenizer's last three ids


def prepare(out: Path, options: TrainOptions, log=print) -> None:
    """The tokenizer and the token streams, made once (a resumed run reuses them)."""
    if (out / "data" / "heldout.npy").is_file():
        return
    from tokenizers import Tokenizer

    from ..tokenizer import tokenizer_config, train_base_tokenizer

    shape = SHAPES[options.shape]
    files = corpus.python_files(options.corpus_bytes)
    train, held = corpus.split(files)
    if not train or not held:
        raise TrainError(f"the corpus has {len(train)} training and {len(held)} held-out files: too few")
    log(f"corpus: {len(train)} training files, {len(held)} held out; training the tokenizer ({shape.vocab_size} ids)")
    tokenizer = train_base_tokenizer([f.path for f in train], shape.vocab_size)
    if tokenizer.get_vocab_size() != shape.vocab_size:
        raise TrainError(f"the tokenizer has {tokenizer.get_vocab_size()} ids, not {shape.vocab_size}: "
                         "the corpus is too small for this vocabulary")
    staging = out / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "data").mkdir(parents=True)
    tokenizer.save(str(staging / "tokenizer.json"))
    data = json.loads((staging / "tokenizer.json").read_text())
    specials = _special_ids(shape.vocab_size)
    (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(specials, data, shape.context_length), indent=2))
    corpus.write_manifest(files, staging / "corpus.json")
    tok = Tokenizer.from_file(str(staging / "tokenizer.json"))
    for name, part in (("train", train), ("heldout", held)):
        stream = corpus.token_stream(part, tok, specials.endoftext)
        np.save(staging / "data" / f"{name}.npy", stream)
        log(f"{name}: {len(stream)} tokens")
    for item in staging.iterdir():
        os.replace(item, out / item.name)
    staging.rmdir()


def build_models(shape: Qwen35Shape, seed: int):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from ..hf_checkpoint import text_config_dict
    from .mtp import MtpHead

    config = Qwen3_5TextConfig(**text_config_dict(shape, _special_ids(shape.vocab_size)))
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config)
    head = MtpHead(config)
    return model, head


def _windows(stream: np.ndarray, rng: np.random.Generator, n: int, length: int):
    import torch

    starts = rng.integers(0, len(stream) - length - 1, size=n)
    return torch.from_numpy(np.stack([stream[s:s + length + 1].astype(np.int64) for s in starts]))


def losses(model, head, tokens):
    """(next-token loss, the head's t+2 loss), mean per token, for a [B, L+1] batch of token ids."""
    import torch.nn.functional as F

    x = tokens[:, :-1]
    hidden = model.model(input_ids=x).last_hidden_state
    logits = model.lm_head(hidden)
    next_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
    # head at t: embed(x_t+1), h_t -> x_t+2, for t = 0 .. L-2
    u = head(model.model.embed_tokens(x[:, 1:]), hidden[:, :-1].detach(), model.model.rotary_emb)
    head_logits = model.lm_head(u)
    mtp_loss = F.cross_entropy(head_logits.reshape(-1, head_logits.shape[-1]).float(), tokens[:, 2:].reshape(-1))
    return next_loss, mtp_loss


def learning_rate(options: TrainOptions, step: int) -> float:
    if step < options.warmup_steps:
        return options.lr * (step + 1) / options.warmup_steps
    progress = (step - options.warmup_steps) / max(1, options.total_steps - options.warmup_steps)
    return options.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _save(out: Path, model, head, optimizer, step: int, log_entries: list, options: TrainOptions) -> None:
    """State and shards written into a new folder, then renamed over the old ones: an interrupted save
    leaves the previous checkpoint whole."""
    import torch

    tmp = out / "saving"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "state").mkdir(parents=True)
    torch.save({"model": model.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step}, tmp / "state" / "state.pt")
    write_shards(tmp / "weights", model, head)
    (tmp / "log.json").write_text(json.dumps({"options": dataclasses.asdict(options), "evaluations": log_entries},
                                             indent=1))
    for name in ("state", "weights"):
        old = out / f"{name}.old"
        shutil.rmtree(old, ignore_errors=True)
        if (out / name).exists():
            os.replace(out / name, old)
        os.replace(tmp / name, out / name)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp / "log.json", out / "log.json")
    tmp.rmdir()


def write_shards(folder: Path, model, head) -> list[Path]:
    """The weights as bfloat16 safetensors shards of at most SHARD_BYTES, in the Hugging Face names of a
    Qwen3.5 checkpoint (the target under model.language_model., the head under mtp.)."""
    import torch
    from safetensors.torch import save_file

    tensors = {hf_name(k): v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    tensors.update({f"mtp.{k}": v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()})
    folder.mkdir(parents=True, exist_ok=True)
    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        n = tensors[name].numel() * 2
        if n > SHARD_BYTES:
            raise TrainError(f"tensor {name} ({n} bytes) is larger than a shard ({SHARD_BYTES} bytes)")
        if current and size + n > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensors[name]
        size += n
    if current:
        shards.append(current)
    paths = []
    for i, shard in enumerate(shards):
        path = folder / f"model-{i:05d}.safetensors"
        save_file(shard, str(path))
        paths.append(path)
    return paths


def hf_name(causal_lm_key: str) -> str:
    """Qwen3_5ForCausalLM's key -> the multimodal checkpoint's (what the builder reads)."""
    return causal_lm_key if causal_lm_key.startswith("lm_head.") else "model.language_model." + causal_lm_key[len("model."):]


def evaluate(model, head, stream: np.ndarray, options: TrainOptions, device: str = "cpu") -> tuple[float, float]:
    import torch

    rng = np.random.default_rng([options.seed, 1 << 20])  # the same windows every evaluation
    model.eval()
    head.eval()
    total_next = total_mtp = 0.0
    with torch.no_grad():
        for i in range(0, EVAL_WINDOWS, options.batch):
            tokens = _windows(stream, rng, min(options.batch, EVAL_WINDOWS - i), options.seq_len)
            a, b = losses(model, head, tokens.to(device))
            total_next += float(a) * len(tokens)
            total_mtp += float(b) * len(tokens)
    model.train()
    head.train()
    return total_next / EVAL_WINDOWS, total_mtp / EVAL_WINDOWS


def train(out, options: TrainOptions | None = None, minutes: float = 10.0, steps: int | None = None,
          log=print, device: str = "cpu") -> dict:
    """Continues the run in `out` for at most `minutes` (and at most `steps` more steps); returns the
    last evaluation. The options are fixed by the first call: a later call with other options is
    refused, so a run cannot silently change course. device "cuda": the steps run on the GPU in
    bfloat16 autocast (float32 weights and optimizer state, as on the CPU); a run may move between
    devices, and is then not bit-reproducible."""
    import contextlib

    import torch

    out = Path(out)
    options = options or TrainOptions()
    if options.shape not in SHAPES:
        raise TrainError(f"unknown shape {options.shape!r} (known: {', '.join(SHAPES)})")
    run_file = out / "run.json"
    if run_file.is_file():
        recorded = json.loads(run_file.read_text())["options"]
        if recorded != dataclasses.asdict(options):
            changed = sorted(k for k in recorded if recorded[k] != dataclasses.asdict(options).get(k))
            raise TrainError(f"{out} was started with other options ({', '.join(changed)}); use a new folder")
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrainError(f"{out} exists and is not a training run (no run.json): give a new or empty folder")
    else:
        out.mkdir(parents=True, exist_ok=True)
        run_file.write_text(json.dumps({"options": dataclasses.asdict(options)}, indent=1))
    if options.threads:
        torch.set_num_threads(options.threads)
    prepare(out, options, log)
    streams = {name: np.load(out / "data" / f"{name}.npy") for name in ("train", "heldout")}
    for name, stream in streams.items():
        if len(stream) <= options.seq_len + 1:
            raise TrainError(f"the {name} stream has {len(stream)} tokens, fewer than a window ({options.seq_len + 1})")
    shape = SHAPES[options.shape]
    model, head = build_models(shape, options.seed)
    if device not in ("cpu", "cuda"):
        raise TrainError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainError("device cuda: torch sees no GPU here")
    model.to(device)
    head.to(device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device == "cuda" else contextlib.nullcontext
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step, entries = 0, []
    if (out / "state" / "state.pt").is_file():
        state = torch.load(out / "state" / "state.pt", weights_only=True, map_location=device)
        model.load_state_dict(state["model"])
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        entries = json.loads((out / "log.json").read_text())["evaluations"]
    start = time.monotonic()
    elapsed_before = entries[-1]["wall_seconds"] if entries else 0.0
    last_step = options.total_steps if steps is None else min(options.total_steps, step + steps)
    tokens_per_step = options.batch * options.seq_len
    while step < last_step and time.monotonic() - start < minutes * 60:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(options, step)
        tokens = _windows(streams["train"], np.random.default_rng([options.seed, step]), options.batch, options.seq_len)
        with autocast():
            next_loss, mtp_loss = losses(model, head, tokens.to(device))
        optimizer.zero_grad(set_to_none=True)
        (next_loss + MTP_WEIGHT * mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        if step % options.eval_every == 0 or step == last_step:
            with autocast():
                held_next, held_mtp = evaluate(model, head, streams["heldout"], options, device)
            entry = {"step": step, "tokens_seen": step * tokens_per_step, "train_loss": next_loss.item(),
                     "train_mtp_loss": mtp_loss.item(), "heldout_loss": held_next, "heldout_mtp_loss": held_mtp,
                     "wall_seconds": round(elapsed_before + time.monotonic() - start, 1)}
            entries.append(entry)
            log(json.dumps(entry))
    if not entries or entries[-1]["step"] != step:
        with autocast():
            held_next, held_mtp = evaluate(model, head, streams["heldout"], options, device)
        entries.append({"step": step, "tokens_seen": step * tokens_per_step, "train_loss": None,
                        "train_mtp_loss": None, "heldout_loss": held_next, "heldout_mtp_loss": held_mtp,
                        "wall_seconds": round(elapsed_before + time.monotonic() - start, 1)})
    _save(out, model, head, optimizer, step, entries, options)
    return entries[-1]


def export_checkpoint(run: Path, hf_dir: Path) -> Path:
    """The run's bfloat16 weights as the Hugging Face folder onnxruntime-genai's builder reads
    (`python -m models convert HF_DIR ...`): config.json of a Qwen3_5ForConditionalGeneration with a
    one-block vision tower (the architecture the builder knows; the tower is never exported),
    model.safetensors, mtp.safetensors and the run's tokenizer."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from ..hf_checkpoint import text_config_dict

    run, hf_dir = Path(run), Path(hf_dir)
    if not (run / "log.json").is_file():
        raise TrainError(f"{run} has no checkpoint (no log.json): train first")
    options = TrainOptions(**json.loads((run / "log.json").read_text())["options"])
    shape = SHAPES[options.shape]
    weights = {}
    for shard in sorted((run / "weights").glob("model-*.safetensors")):
        weights.update(load_file(str(shard)))
    text = text_config_dict(shape, _special_ids(shape.vocab_size))
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=shape.hidden_size)
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    state = model.state_dict()
    target = {k: v.to(torch.float32) for k, v in weights.items() if not k.startswith("mtp.")}
    missing = [k for k in state if k not in target and not k.startswith("model.visual.")]
    if missing:
        raise TrainError(f"{run}: the weights lack {missing[0]} (and {len(missing) - 1} more)")
    state.update(target)
    model.load_state_dict(state)
    from ops.staging import OutputError, check_output, staged_folder

    try:
        check_output(hf_dir, run)  # never into the run folder, nor through a link
        with staged_folder(hf_dir) as staging:  # a new or empty folder, written whole or not at all
            model.save_pretrained(staging)
            save_file({k: v.to(torch.float32).contiguous() for k, v in weights.items() if k.startswith("mtp.")},
                      str(staging / "mtp.safetensors"))
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copyfile(run / name, staging / name)
    except OutputError as e:
        raise TrainError(str(e)) from None
    return hf_dir
