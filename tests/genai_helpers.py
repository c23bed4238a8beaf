"""onnxruntime-genai as the tests' reference: its plain greedy decode."""

from __future__ import annotations


def genai_greedy(model, ids: list[int], new_tokens: int) -> list[int]:
    """The tokens onnxruntime-genai's greedy Generator produces after `ids` on `model`: `new_tokens`,
    or fewer up to and including an end-of-sequence token (which get_sequence would leave out)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens([list(ids)])
    out = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out
