"""Text in and out with the `tokenizers` library reading the folder's tokenizer.json.

(onnxruntime-extensions, which onnxruntime-genai uses, refuses the builder's Qwen3_5Tokenizer class.)
"""

from __future__ import annotations

from pathlib import Path

from .errors import DriverError


class TokenizerUnavailable(DriverError):
    """The `tokenizers` package is not installed (token ids in and out still work)."""


def check_text(text: str) -> None:
    """Text the tokenizer takes: a str that is valid Unicode. Python turns the bytes of a command-line
    argument that are not UTF-8 into lone surrogates (U+DC80..U+DCFF stand for bytes 0x80..0xff),
    which `tokenizers` refuses with a bare TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate U+{code:04X}"
        raise DriverError(f"the prompt is not valid UTF-8 text: character {e.start} is {what}") from None


class Text:
    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerUnavailable("reading text needs the `tokenizers` package (pip install tokenizers)") from None
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise DriverError(f"{path} is not a readable tokenizer.json ({e})") from None

    def encode(self, text: str) -> list[int]:
        check_text(text)
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def stream(self) -> "TextStream":
        return TextStream(self.tokenizer)


class TextStream:
    """Decodes token by token, returning only the text that became final (a multi-byte character
    split over tokens is held back until complete)."""

    def __init__(self, tokenizer):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.decoder = DecodeStream(skip_special_tokens=False)

    def push(self, ids) -> str:
        out = []
        for i in ids:
            piece = self.decoder.step(self.tokenizer, int(i))
            if piece:
                out.append(piece)
        return "".join(out)
