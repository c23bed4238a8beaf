"""Run ort_mtp::GatedDeltaNet (27B-class layer, fp16, W=4) eagerly at S=1 then S=4, 6 calls each, for ncu.
Rotates 8 state buffers so the state is not the one the last call left in L2 (closer to decode)."""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ops.gated_delta_net as gdn
from driver.device import bind, make_device, make_session
from ops.gated_delta_net import GdnConfig

device = make_device("cuda", graph_capture=False)
cfg = GdnConfig(16, 48, 128, 128, state_window=4, dtype="float16", epsilon=1e-6)
w = gdn.random_weights(np.random.default_rng(0), cfg)
xp = device.xp
with device.active():
    session = make_session(device, gdn.gated_delta_net_model(cfg, w), graph_capture=False)
    for S in (1, 4):
        x = gdn.random_inputs(np.random.default_rng(S), cfg, 1, S)
        bufs = {name: xp.asarray(v.astype(np.float16)) for name, v in x.items()}
        pasts = [xp.asarray(x["past_recurrent"].astype(np.float16)) for _ in range(8)]
        outs = {"y": xp.full((1, S, cfg.value_dim), np.nan, dtype=np.float16),
                "present_conv": xp.empty_like(bufs["past_conv"]),
                "present_recurrent": xp.empty_like(bufs["past_recurrent"])}
        for i in range(6):
            bufs["past_recurrent"] = pasts[i % 8]
            binding = session.io_binding()
            for name, buf in bufs.items():
                bind(binding, device, name, buf, buf.shape)
            for name, buf in outs.items():
                bind(binding, device, name, buf, buf.shape, output=True)
            session.run_with_iobinding(binding)
            device.synchronize()
        print("S", S, "ok", float(xp.abs(outs["y"].astype(xp.float32)).max()))
