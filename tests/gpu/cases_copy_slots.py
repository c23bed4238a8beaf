"""ort_mtp::CopySlots on the device: the checks of the copy_slots group.

The op copies one slot (leading-axis index) of each src_i into dst_i, or whole tensors for slots
(-1, -1), all pairs in one batch of launches on the session's stream (README.md, "Op reference").
The driver runs it in place, every output bound to its destination buffer, to promote a state-window
slot. The cases, each compared bit-exactly (as bytes, so every dtype alike) with ops.copy_slots.expected:

  1. promote in place (src = dst = out), slot a -> slot 3 for a = 0..3, every dtype in one launch;
  2. slot copy from a window [4, ...] into separate, random-filled outputs [1, ...], the inputs
     left untouched;
  3. whole copies (-1, -1) into separate outputs;
  4. 150 tensors in place: more ranges than one launch takes;
  5. in place under ORT's CUDA graph: capture, then replays on new buffer contents;
  6. the same copy called directly (ops.copy_slots.RangeCopier, the driver's slot promotion): slot a ->
     slot 3 in place for every dtype, and the 150 tensors (two launches), on the device's stream.

The tensors mix float16, float32, bfloat16, int64, uint8 and bool with odd byte counts (MIXED).
"""

from __future__ import annotations

import numpy as np

from harness import Buffer, Context  # first: it puts the checkout on sys.path

from driver.device import bind_host, make_session  # noqa: E402
from ops import nbits  # noqa: E402
from ops.copy_slots import Pair, RangeCopier, copy_slots_model, expected, ranges  # noqa: E402

MIXED = [("float16", (4, 1, 64, 3)), ("float32", (4, 1, 6, 16, 16)), ("bfloat16", (4, 2, 33)),
         ("int64", (4, 5)), ("uint8", (4, 7)), ("bool", (4, 3)), ("float16", (4, 1, 1024, 3)),
         ("float32", (4, 1, 48, 32, 32))]
MANY = [("float16", (4, 100 + i)) for i in range(150)]


def random_buffer(device, rng, dtype: str, shape) -> Buffer:
    if dtype == "bool":
        values = rng.integers(0, 2, size=shape).astype(bool)
    elif dtype in ("int64", "uint8", "int32"):
        values = rng.integers(0, 200, size=shape).astype(dtype)
    else:
        values = nbits.round_to(rng.standard_normal(shape), dtype)
    return Buffer.upload(device, values, dtype)


def in_place_pairs(specs) -> list[Pair]:
    return [Pair(dtype, shape, shape) for dtype, shape in specs]


def bind_copy(session, slots: np.ndarray, pairs, outs):
    """An IOBinding of slots (host), src_i, dst_i and out_i."""
    binding = session.io_binding()
    bind_host(binding, "slots", slots)  # read by the op on the host
    for i, ((src, dst), out) in enumerate(zip(pairs, outs)):
        src.bind(binding, f"src_{i}")
        dst.bind(binding, f"dst_{i}")
        out.bind(binding, f"out_{i}", output=True)
    return binding


def run_copy(device, session, slots, pairs, outs) -> None:
    slots = np.asarray(slots, dtype=np.int64)
    session.run_with_iobinding(bind_copy(session, slots, pairs, outs), device.run_options(None))
    device.synchronize()


def promoted_as_expected(bufs, before, slots) -> bool:
    """Every buffer now equals its own contents before with slot slots[0] copied onto slot slots[1]."""
    return all(np.array_equal(b.raw(), expected(host, host, slots)) for b, host in zip(bufs, before))


def check_copy_slots(ctx: Context):
    """The six cases of the module docstring; one record per case (case 1: per source slot)."""
    device, rng = ctx.device, ctx.rng

    def record(name, ok, **extra):
        return {"case": name, "ok": bool(ok), "problem": None if ok else "output differs from numpy", **extra}

    # 1. Promote in place: src = dst = out, slot a -> slot W-1, every dtype in one launch.
    session = make_session(device, copy_slots_model(in_place_pairs(MIXED)))
    for a in range(4):
        ctx.started(f"promote in place slot {a}->3")
        bufs = [random_buffer(device, rng, dt, shape) for dt, shape in MIXED]
        before = [b.raw() for b in bufs]
        run_copy(device, session, (a, 3), [(b, b) for b in bufs], bufs)
        yield record(f"promote in place slot {a}->3", promoted_as_expected(bufs, before, (a, 3)), tensors=len(bufs))

    # 2. Slot copy into a separate output: window [4, ...] -> committed [1, ...].
    ctx.started("slot 2 -> 0 into separate outputs")
    session = make_session(device, copy_slots_model([Pair(dt, shape, (1,) + shape[1:]) for dt, shape in MIXED]))
    srcs = [random_buffer(device, rng, dt, shape) for dt, shape in MIXED]
    dsts = [random_buffer(device, rng, dt, (1,) + shape[1:]) for dt, shape in MIXED]
    outs = [random_buffer(device, rng, dt, (1,) + shape[1:]) for dt, shape in MIXED]  # "poison": random
    dst_before = [d.raw() for d in dsts]
    run_copy(device, session, (2, 0), list(zip(srcs, dsts)), outs)
    ok = all(np.array_equal(o.raw(), s.raw()[2:3]) for o, s in zip(outs, srcs))
    ok &= all(np.array_equal(d.raw(), h) for d, h in zip(dsts, dst_before))  # inputs untouched
    yield record("slot 2 -> 0 into separate outputs", ok, tensors=len(srcs))

    # 3. Whole copies (-1, -1) into separate outputs.
    ctx.started("whole copy into separate outputs")
    session = make_session(device, copy_slots_model(in_place_pairs(MIXED)))
    srcs = [random_buffer(device, rng, dt, shape) for dt, shape in MIXED]
    dsts = [random_buffer(device, rng, dt, shape) for dt, shape in MIXED]
    outs = [random_buffer(device, rng, dt, shape) for dt, shape in MIXED]
    run_copy(device, session, (-1, -1), list(zip(srcs, dsts)), outs)
    ok = all(np.array_equal(o.raw(), s.raw()) for o, s in zip(outs, srcs))
    yield record("whole copy into separate outputs", ok, tensors=len(srcs))

    # 4. Many tensors (two launches' worth of ranges), in place.
    ctx.started("150 tensors in place")
    session = make_session(device, copy_slots_model(in_place_pairs(MANY)))
    bufs = [random_buffer(device, rng, dt, s) for dt, s in MANY]
    before = [b.raw() for b in bufs]
    run_copy(device, session, (1, 3), [(b, b) for b in bufs], bufs)
    yield record("150 tensors in place", promoted_as_expected(bufs, before, (1, 3)), tensors=len(bufs))

    # 5. In place under ORT's CUDA graph: capture, then replay on new buffer contents.
    ctx.started("in place under CUDA graph (capture + replays)")
    session = make_session(device, copy_slots_model(in_place_pairs(MIXED)), graph_capture=ctx.on_gpu)
    bufs = [random_buffer(device, rng, dt, shape) for dt, shape in MIXED]
    slots = np.asarray((1, 3), dtype=np.int64)
    binding = bind_copy(session, slots, [(b, b) for b in bufs], bufs)
    steps = []
    for _ in range(3):
        for b in bufs:
            b.copy_from(random_buffer(device, rng, b.dtype, b.shape))
        before = [b.raw() for b in bufs]
        session.run_with_iobinding(binding, device.run_options(1))
        device.synchronize()
        steps.append(promoted_as_expected(bufs, before, (1, 3)))
    yield record("in place under CUDA graph (capture + replays)", all(steps), steps=steps)

    # 6. The direct call: one range per buffer, slot a -> slot 3 in place, queued on the device's stream.
    copier = RangeCopier()
    stream = device.stream.ptr if ctx.on_gpu else 0
    for specs, a in ((MIXED, 0), (MIXED, 2), (MANY, 1)):
        name = f"direct call, {len(specs)} tensors, slot {a}->3"
        ctx.started(name)
        bufs = [random_buffer(device, rng, dt, shape) for dt, shape in specs]
        before = [b.raw() for b in bufs]
        records = []
        for b in bufs:
            slot_bytes = b.data.nbytes // b.shape[0]
            base = device.pointer(b.data)
            records.append((base + a * slot_bytes, base + 3 * slot_bytes, slot_bytes))
        copier(ranges(records), cuda=ctx.on_gpu, stream=stream)
        device.synchronize()
        yield record(name, promoted_as_expected(bufs, before, (a, 3)), tensors=len(bufs))
