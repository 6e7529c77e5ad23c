"""Next-token cross-entropy over the response tokens, from the decoder's last hidden states.

Computing it here rather than through the Hugging Face head lets torch.compile fuse the logits'
upcast to fp32 into the loss instead of materialising a (tokens x vocab) fp32 tensor.

With `train.loss_chunks` > 1 the logits are made a block of rows at a time, and each block's
gradients are computed right away in forward (the loss is the last op of the step, so they are
known then): neither the logits nor their gradient ever exist whole (at seq 4096 and a 32,000-token
vocabulary, 250 MiB each in bf16), at the cost of the loss running uncompiled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ghsweep.train.data import IGNORE_INDEX


def causal_lm_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden[:, :-1], lm_head_weight).float()
    return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)


def chunked_causal_lm_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor,
                           chunks: int) -> torch.Tensor:
    """causal_lm_loss, its logits made in `chunks` blocks of rows."""
    return _ChunkedCrossEntropy.apply(hidden[:, :-1].reshape(-1, hidden.shape[-1]), lm_head_weight,
                                      labels[:, 1:].reshape(-1), chunks)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunks: int) -> torch.Tensor:
        counted = (labels != IGNORE_INDEX).sum()
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if hidden.requires_grad else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if weight.requires_grad else None
        rows = -(-hidden.shape[0] // chunks)
        for start in range(0, hidden.shape[0], rows):
            h, target = hidden[start:start + rows], labels[start:start + rows]
            logits = (h @ weight.t()).float()
            keep = (target != IGNORE_INDEX).unsqueeze(1)
            index = target.clamp(min=0).unsqueeze(1)
            log_z = logits.logsumexp(-1, keepdim=True)
            total += ((log_z - logits.gather(1, index)) * keep).sum()
            # d(loss)/d(logits): softmax minus the one-hot target over the counted tokens, kept rows only.
            grad = logits.sub_(log_z).exp_().scatter_add_(1, index, -torch.ones_like(log_z))
            grad = grad.mul_(keep / counted).to(h.dtype)
            if grad_hidden is not None:
                grad_hidden[start:start + rows] = grad @ weight
            if grad_weight is not None:
                grad_weight += (grad.t() @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total / counted

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (None if grad_hidden is None else grad_hidden * grad_loss.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * grad_loss).to(ctx.weight_dtype), None, None)
