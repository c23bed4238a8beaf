"""The one-layer MTP head of a Qwen3.5 checkpoint, in torch, with the names real checkpoints ship
(`mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`) and the
arithmetic onnxruntime-genai's builder exports into mtp.onnx (models/graph.py's build_mtp is the same
graph): at position t it reads the target's final normed hidden state h_t and the embedding of the
next token x_t+1 and predicts x_t+2:

    u = fc(concat(norm_e(embed(x_t+1)), norm_h(h_t)));  u = decoder_layer(u) (gated full attention
    over the head's own earlier positions, then the MLP);  logits = lm_head(norm(u))

with the target's embedding and lm_head.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class MtpHead(nn.Module):
    def __init__(self, text_config):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        hidden, eps = text_config.hidden_size, text_config.rms_norm_eps
        layer_config = copy.deepcopy(text_config)
        layer_config.layer_types = ["full_attention"]
        layer_config.num_hidden_layers = 1
        self.config = layer_config
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_config, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)

    def forward(self, next_embeds: torch.Tensor, hidden: torch.Tensor, rotary) -> torch.Tensor:
        """The head's final normed hidden state for each position ([B, T, H]); `rotary` is the target's
        rotary embedding module (positions 0 .. T-1: only their differences matter to attention)."""
        from transformers.masking_utils import create_causal_mask

        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        b, t = u.shape[:2]
        positions = torch.arange(t, device=u.device).view(1, 1, -1).expand(3, b, -1)
        import inspect

        # transformers renamed past_key_values to cache in 5.2x: pass whichever this version takes
        cache_arg = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
        mask = create_causal_mask(config=self.config, inputs_embeds=u, attention_mask=None,
                                  position_ids=positions[0], **{cache_arg: None})
        u = self.layers[0](u, position_embeddings=rotary(u, positions), attention_mask=mask, position_ids=positions[0])
        return self.norm(u)
