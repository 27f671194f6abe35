"""The optimizer of every trainer: Adam, or AdamW with decay groups when weight decay is on.

- ``weight_decay == 0`` (RL, report §4.1: "Adam, full-parameter updates"; SFT by default): one
  ``torch.optim.Adam`` group over every trainable parameter.
- ``weight_decay > 0`` (pretraining): ``torch.optim.AdamW`` with two groups. Decay pulls weights
  towards zero, which is right for the matrices of the layers and wrong for the rest: biases and
  norm scales (one number per channel, any 1-D parameter) set offsets and gains, and an embedding
  row is updated only when its token occurs, so decay would shrink rare tokens' rows between their
  updates. Those go into the group without decay. A tied output head shares the embedding's
  tensor, so it is not decayed either.

Not here: the learning rate over time (``training.schedule``; callers set ``group["lr"]`` each
step), gradient clipping (each trainer's step).
"""

from __future__ import annotations

import torch


def decay_groups(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """Names of the trainable parameters to decay, and of those not to (see module doc)."""
    embeddings = {id(p) for module in model.modules() if isinstance(module, torch.nn.Embedding)
                  for p in module.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if parameter.dim() < 2 or id(parameter) in embeddings:
            no_decay.append(name)
        else:
            decay.append(name)
    return decay, no_decay


def build_optimizer(
    model: torch.nn.Module,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """Adam over every trainable parameter, or AdamW with decay groups when ``weight_decay > 0``."""
    if weight_decay < 0:
        raise ValueError(f"weight_decay: expected a number >= 0, got {weight_decay}")
    betas = (float(betas[0]), float(betas[1]))
    if weight_decay == 0:
        trainable = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.Adam(trainable, lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    parameters = dict(model.named_parameters())
    decay, no_decay = decay_groups(model)
    return torch.optim.AdamW(
        [{"params": [parameters[n] for n in decay], "weight_decay": weight_decay},
         {"params": [parameters[n] for n in no_decay], "weight_decay": 0.0}],
        lr=lr, betas=betas, eps=eps,
    )
