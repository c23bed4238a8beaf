"""A Qwen-style byte-level BPE tokenizer made here, padded so that every id the model can emit decodes.

The base tokenizer (data/base_tokenizer.json, 8192 ids) was trained with `tokenizers` on text that
ships with Python (the standard library's top-level modules) and the license texts under
/usr/share/common-licenses: `python -m models tokenizer --out FILE` retrains it. It is committed so
every machine builds byte-identical folders (the stdlib differs between Python versions).

Layout of the ids, as in Qwen's own tokenizer: the trained byte-level BPE tokens first, then the
special tokens <|endoftext|>, <|im_start|>, <|im_end|>. A model whose vocabulary is larger (Qwen3.5:
248320) gets filler tokens up to its size: plain BPE vocabulary entries made by concatenating two
trained tokens (so they decode to ordinary text) that no merge ever produces, so encoding is
unchanged while any id a random model emits still decodes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

BASE_TOKENIZER = Path(__file__).parent / "data" / "base_tokenizer.json"
BASE_VOCAB_SIZE = 8192
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2's pre-tokenizer split: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs, newlines, other whitespace.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class SpecialIds:
    endoftext: int
    im_start: int
    im_end: int

    @property
    def all(self) -> tuple[int, ...]:
        return (self.endoftext, self.im_start, self.im_end)


def default_training_files() -> list[str]:
    """Text that is on any machine with Python: the stdlib's top-level modules, license texts."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))
    licenses = Path("/usr/share/common-licenses")
    if licenses.is_dir():
        files += sorted(str(p) for p in licenses.iterdir() if p.is_file())
    return files


def train_base_tokenizer(files: Iterable[str], vocab_size: int = BASE_VOCAB_SIZE):
    """Byte-level BPE with Qwen2's pre-tokenizer; the special tokens take the last three ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(f) for f in files], trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def load_base() -> dict:
    with open(BASE_TOKENIZER, encoding="utf-8") as f:
        return json.load(f)


def special_ids(tokenizer_json: dict) -> SpecialIds:
    ids = {t["content"]: t["id"] for t in tokenizer_json["added_tokens"]}
    return SpecialIds(*(ids[t] for t in SPECIAL_TOKENS))


def _fillers(vocab: dict[str, int], count: int) -> list[str]:
    """`count` new byte-level strings: a space-led word token followed by a letters-only token."""
    by_id = sorted(vocab, key=vocab.get)
    # (byte-level BPE writes a space as "\u0120", which str.isalpha() counts as a letter: ask for ASCII)
    heads = [t for t in by_id if t.startswith("\u0120") and len(t) > 2 and t[1:].isascii() and t[1:].isalpha()]
    tails = [t for t in by_id if len(t) > 1 and t.isalpha() and t.isascii()]
    out: list[str] = []
    seen = set(vocab)
    i = 0
    limit = len(heads) * len(tails)
    while len(out) < count:
        if i >= limit:
            raise ValueError(f"cannot make {count} filler tokens from this base vocabulary")
        token = heads[i % len(heads)] + tails[(i // len(heads) + 7 * i) % len(tails)]
        i += 1
        if token not in seen:
            seen.add(token)
            out.append(token)
    return out


def tokenizer_json_for_vocab(vocab_size: int, base: dict | None = None) -> dict:
    """The base tokenizer with filler tokens appended up to `vocab_size` ids."""
    data = json.loads(json.dumps(base if base is not None else load_base()))  # deep copy
    vocab: dict[str, int] = data["model"]["vocab"]
    size = max([*vocab.values(), *(t["id"] for t in data["added_tokens"])]) + 1
    if vocab_size < size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the base tokenizer ({size} ids)")
    if vocab_size == size:
        return data
    # `tokenizers` numbers an added token that is missing from the model vocabulary after the last
    # model id, whatever id the file gives it: with fillers after them, the special tokens must be
    # in the model vocabulary at their own ids to keep them.
    for token in data["added_tokens"]:
        vocab[token["content"]] = token["id"]
    for offset, token in enumerate(_fillers(vocab, vocab_size - size)):
        vocab[token] = size + offset
    return data


def tokenizer_config(specials: SpecialIds, tokenizer_json: dict, context_length: int) -> dict:
    """tokenizer_config.json as transformers writes it for a Qwen2 tokenizer (the class that
    onnxruntime-genai's tokenizer reads; it rejects the newer Qwen3_5Tokenizer name)."""
    added = {
        str(t["id"]): {
            "content": t["content"],
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in tokenizer_json["added_tokens"]
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": context_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_tokenizer_files(folder: str | os.PathLike, vocab_size: int, context_length: int) -> SpecialIds:
    """Writes tokenizer.json and tokenizer_config.json; returns the special token ids."""
    data = tokenizer_json_for_vocab(vocab_size)
    folder = Path(folder)
    with open(folder / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    specials = special_ids(data)
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(specials, data, context_length), f, indent=2, ensure_ascii=False)
    return specials
