"""Measuring token identity: is row j of a width-W forward the row a width-1 decode step produces?

MTP equals greedy token for token exactly when every verify row equals the decode row at the same
position (same cache, same tokens) — bitwise for the committed state, and at least never flipping an
argmax for the logits. Two measurements:

  rows(...)    the real sessions (rewritten graph, ORT optimisations on, the driver's buffers): a
               forward of W tokens against W width-1 forwards from the same state; compares logits
               and hidden rows and the resulting KV cache and linear-attention state.
  per_op(...)  which ops make rows differ: the graph with every node output exposed and graph
               optimisations off (so node outputs exist), the same comparison per node output; a node
               is an origin when its output rows differ although all its input rows were equal.

  streams(...) the end result: MTP token streams against greedy streams over many prompts, per k.

`python -m driver identity --model DIR [--streams]` prints them.

All of them measure MatMulNBits in its row-major layout (pack=False), on CUDA too, where the driver
packs by default (driver.sessions): per_op's session is built here without the tiles cache, and rows
and the CLI's generators match it. The tiles layout's rows are the same bits on the CPU
(tests/test_tiles_cache.py); on CUDA its kernel is another one, measured by the device checks.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

import ops

from .device import make_device
from .folder import ModelFolder
from .runner import GraphRunner
from .sessions import EXTERNAL_DATA_FOLDER, create_session, rewrite_graph


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def rows(folder: ModelFolder, prompt: list[int], tokens: list[int], provider: str = "cpu",
         rewrite: bool = True, max_length: int = 256, threads: int | None = None) -> dict:
    """Wide forward of `tokens` after `prompt` vs one width-1 forward per token."""
    device = make_device(provider, graph_capture=False, threads=threads)
    with device.active():
        return _rows(folder, prompt, tokens, device, rewrite, max_length)


def _rows(folder: ModelFolder, prompt: list[int], tokens: list[int], device, rewrite: bool, max_length: int) -> dict:
    session, _ = create_session(folder.main, device, max_length, rewrite=rewrite, pack=False)
    width = len(tokens)

    def prefilled() -> GraphRunner:
        runner = GraphRunner(folder.main, session, device, max_length, max(len(prompt), width),
                             folder.vocab_size, folder.hidden_size)
        runner.ids[0, :len(prompt)] = device.xp.asarray(prompt, dtype=np.int64)
        runner.forward(len(prompt))
        runner.advance(len(prompt))
        return runner

    host = device.to_host
    wide = prefilled()
    wide.ids[0, :width] = device.xp.asarray(tokens, dtype=np.int64)
    wide.forward(width)
    wide_logits, wide_hidden = host(wide.logits[0, :width]).copy(), host(wide.hidden[0, :width]).copy()
    wide.advance(width)
    step = prefilled()
    step_logits, step_hidden = [], []
    for tok in tokens:
        step.ids[0, 0] = tok
        step.forward(1)
        step.advance(1)
        step_logits.append(host(step.logits[0, 0]).copy())
        step_hidden.append(host(step.hidden[0, 0]).copy())
    n = wide.length
    kv = max(_max_diff(host(a[:, :, :n]), host(b[:, :, :n])) for a, b in zip(wide.kv, step.kv))
    # The state after the last token: with a state window, slot W-1 (the slots below it hold each
    # verify token's state in the wide forward and zeros in a width-1 step, so they are not compared).
    last = (lambda s: s[-1]) if folder.main.state_window else (lambda s: s)
    state = max((_max_diff(host(last(a)), host(last(b))) for a, b in zip(wide.live_states(), step.live_states())),
                default=0.0)
    return {
        "width": width,
        "logits_rows_equal": [bool(np.array_equal(wide_logits[j], step_logits[j])) for j in range(width)],
        "logits_max_diff": [_max_diff(wide_logits[j], step_logits[j]) for j in range(width)],
        "hidden_rows_equal": [bool(np.array_equal(wide_hidden[j], step_hidden[j])) for j in range(width)],
        "argmax_equal": [int(np.argmax(wide_logits[j])) == int(np.argmax(step_logits[j])) for j in range(width)],
        "kv_max_diff": kv,
        "state_max_diff": state,
    }


def per_op(folder: ModelFolder, prompt: list[int], tokens: list[int], provider: str = "cpu",
           rewrite: bool = True, threads: int | None = None) -> list[dict]:
    """Per node output: max |wide row j - decode row j| for each j, for nodes where any row differs,
    in graph order (the first entry is where a difference starts)."""
    spec = folder.main
    device = make_device(provider, graph_capture=False, threads=threads)
    proto, _ = rewrite_graph(spec, rewrite, device)  # what the driver's own sessions run
    declared = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in declared:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ops.register(options)
    options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(spec.path.parent.resolve()))
    device.session_options(options)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=device.providers(False))
    names = [o.name for o in session.get_outputs()]
    carried = spec.kv + spec.recurrent

    def run(ids: list[int], length: int, state: dict) -> tuple[dict, dict]:
        width = len(ids)
        feeds = {spec.input_ids: np.asarray([ids], np.int64),
                 spec.attention_mask: np.ones((1, length + width), np.int64),
                 spec.position_ids: np.tile(np.arange(length, length + width, dtype=np.int64), (3, 1, 1))}
        feeds.update(state)
        result = dict(zip(names, session.run(None, feeds)))
        return result, {s.past: result[s.present] for s in carried}

    empty = {}
    for s in carried:
        shape = tuple(0 if d == -1 else d for d in s.shape)
        empty[s.past] = np.zeros(shape, s.dtype)
    _, after_prompt = run(prompt, 0, empty)
    wide, _ = run(tokens, len(prompt), after_prompt)
    steps, state = [], after_prompt
    for j, tok in enumerate(tokens):
        result, state = run([tok], len(prompt) + j, state)
        steps.append(result)
    width = len(tokens)
    # tainted: tensors that differ or may (computed from a differing tensor, even where the rows of a
    # flattened tensor cannot be lined up); an op is an origin when it makes rows differ untainted
    report, tainted = [], set()
    for node in proto.graph.node:
        inputs_tainted = any(i in tainted for i in node.input)
        for name in node.output:
            if not name or name not in wide:
                continue
            a, b0 = wide[name], steps[0][name]
            axes = [i for i, (p, q) in enumerate(zip(a.shape, b0.shape)) if p != q] if a.ndim == b0.ndim else []
            if len(axes) != 1 or a.shape[axes[0]] != width or b0.shape[axes[0]] != 1:
                if inputs_tainted:
                    tainted.add(name)
                continue  # not a per-token tensor (shapes, flattened views): judged by what it feeds
            axis = axes[0]
            diffs = [_max_diff(np.take(a, [j], axis=axis), steps[j][name]) for j in range(width)]
            if any(d > 0 for d in diffs):
                tainted.add(name)
                report.append({"op": node.op_type, "domain": node.domain or "ai.onnx", "node": node.name,
                               "output": name, "row_max_diff": diffs, "origin": not inputs_tainted})
            elif inputs_tainted:
                tainted.add(name)
    return report


def summarize_ops(report: list[dict]) -> list[tuple[str, int, float]]:
    """For ops that originate a difference: (op type, nodes, largest row difference), in graph order."""
    order, count, worst = [], {}, {}
    for entry in report:
        if not entry["origin"]:
            continue
        op = entry["op"]
        if op not in count:
            order.append(op)
            count[op], worst[op] = 0, 0.0
        count[op] += 1
        worst[op] = max(worst[op], max(entry["row_max_diff"]))
    return [(op, count[op], worst[op]) for op in order]


SAMPLE_PROMPTS = [
    "def main():",
    "import os\nimport sys\n",
    "class Parser:\n    def __init__(self, text):",
    "Hello world, this is",
    "for i in range(10):\n    print(i)",
    "The quick brown fox jumps over the lazy dog.",
    "return self._value",
    "if __name__ == '__main__':",
    "# Copyright 2024",
    "x = [a * b for a, b in zip(xs, ys)]",
    "raise ValueError('bad input')",
    "with open(path) as f:\n    data = f.read()",
    "try:\n    import numpy\nexcept ImportError:",
    "Once upon a time",
    "lambda x: x + 1",
    "while True:\n    line = input()",
    "from collections import defaultdict",
    "async def fetch(url):",
    "assert len(items) == 3, items",
    "print('done', flush=True)",
    "The",
    "{\"key\": [1, 2, 3]}",
]


def streams(generator, prompts, new_tokens: int, ks) -> list[dict]:
    """Per k: on how many prompts the MTP stream equals the greedy stream, and the round counters."""
    greedy = [generator.generate(p, new_tokens, mode="greedy", stop_at_eos=False).tokens for p in prompts]
    out = []
    for k in ks:
        identical, divergences, total = 0, [], {"accepted": 0, "drafted": 0, "rounds": 0, "round_tokens": 0}
        commits: dict = {}
        for prompt, expected in zip(prompts, greedy):
            result = generator.generate(prompt, new_tokens, mode="mtp", draft_tokens=k, stop_at_eos=False)
            if result.tokens == expected:
                identical += 1
            else:
                divergences.append(next(i for i, (a, b) in enumerate(zip(result.tokens, expected)) if a != b))
            s = result.stats
            for key in total:
                total[key] += getattr(s, key)
            for key, value in s.commits.items():
                commits[key] = commits.get(key, 0) + value
        out.append({"k": k, "prompts": len(prompts), "identical": identical, "first_divergences": divergences,
                    "acceptance": total["accepted"] / total["drafted"] if total["drafted"] else 0.0,
                    "tokens_per_round": total["round_tokens"] / total["rounds"] if total["rounds"] else 0.0,
                    "commits": commits})
    return out
