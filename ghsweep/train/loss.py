"""Next-token cross-entropy over the response tokens, from the decoder's last hidden states.

Computing it here rather than through the Hugging Face head lets torch.compile fuse the logits'
upcast to fp32 into the loss instead of materialising a (tokens x vocab) fp32 tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ghsweep.train.dolly_data import IGNORE_INDEX


def causal_lm_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden[:, :-1], lm_head_weight).float()
    return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)
