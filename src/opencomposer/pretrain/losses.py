"""The losses a phase sums (``PhaseConfig.losses``): ``LOSSES`` maps each name to its function.

``lm``: next-token cross-entropy on the packed rows (plus the MoE load-balancing term); the
forward takes the rows' position ids, so it attends inside each document only
(``training.attention.packed_attention``; the other forwards take transformers' own
packed-sequence path, a block-diagonal causal mask built when the forward has position ids, no
attention mask and no cache). ``sft``: cross-entropy on the model-written tokens of recorded
tool episodes (prompts and tool outputs are context only), averaged over the batch's model
tokens. ``mtp``: multi-token prediction by self-distillation (``model.mtp``): the MTP layers learn,
by KL, the detached main head's distribution at the shifted position, on the packed rows
(sharing the ``lm`` forward) or, in a phase with ``sft`` and no ``lm``, at the demonstrations'
model tokens; the trunk gets no gradient from it.

Under data and context parallelism each loss returns this rank's part of the step's loss: the
cross-entropy sums over the rank's targets divided by the whole batch's, the MTP KL sums divided
by the valid rows of every rank; the parts add up to the single-process loss. The load-balancing
term is per rank and averaged (``StepData``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from opencomposer.distributed.runtime import World
from opencomposer.training.attention import packed_attention
from opencomposer.training.forward import target_nll


def packed_forward(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, router_logits: bool = False):
    """The forward on packed rows: inputs ``ids[:, :-1]`` at their position ids, no cache (the
    document mask needs it off; module doc)."""
    extra = {"output_router_logits": True} if router_logits else {}
    with packed_attention(model, positions[:, :-1]):
        return model(input_ids=ids[:, :-1], position_ids=positions[:, :-1], use_cache=False, **extra)


def token_losses(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every target of packed rows, ``[B, T]``."""
    return target_nll(packed_forward(model, ids, positions).logits, ids[:, 1:])


@dataclass
class StepData:
    """What a step's losses read: the packed corpus rows and/or the demonstration batch, and the
    main forward on the rows, run once a step for every loss that reads it (``lm_forward``).

    Under data and context parallelism (``world``, module doc) ``ids``/``positions`` and ``demos``
    are this rank's share of the batch, ``lm_share`` its share of the rows' targets and
    ``demo_tokens`` the whole demonstration batch's model tokens: each loss returns this rank's
    part of the step's loss (the parts add up over the ranks) and metrics of the whole batch or,
    for ``lm_loss``, ``sft_loss`` and ``aux_loss``, this rank's part (merged over the ranks by ``training.metrics.merge_ranks``)."""

    ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    demos: Any = None  # a training.packing TrainBatch
    hidden: bool = False  # the rows' forward also returns the last hidden state (for ``mtp``)
    world: World = field(default_factory=World)
    lm_share: float = 1.0  # this rank's share of the rows' targets
    demo_tokens: int = 0  # model tokens of the whole demonstration batch (0: this batch's)
    pad_id: int = 0
    bf16: bool = False  # the demonstrations' forward under bf16 autocast (``sft.bf16``)
    _forward: Any = None
    _forward_grad: bool = False

    def lm_forward(self, model: torch.nn.Module, grad: bool = True):
        """The model's forward on the packed rows (inputs ``ids[:, :-1]``; this rank's chunks of
        them under context parallelism), with the router logits when the MoE load-balancing term
        is on; computed once and reused, recomputed only when a loss needs the graph that an
        earlier no-graph call did not build."""
        if self._forward is None or (grad and not self._forward_grad):
            aux = (getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0) > 0
            extra = {"output_router_logits": True} if aux else {}
            ids, positions = self.ids[:, :-1], self.positions[:, :-1]
            with torch.enable_grad() if grad else torch.no_grad():
                if self.world.cp > 1:
                    from opencomposer.distributed.context import cp_forward

                    self._forward = cp_forward(model, ids, positions, self.world.cp_group, hidden=self.hidden, **extra)
                else:
                    with packed_attention(model, positions):
                        self._forward = model(input_ids=ids, position_ids=positions, use_cache=False,
                                              output_hidden_states=self.hidden, **extra)
            self._forward_grad = grad
        return self._forward

    def lm_targets(self) -> torch.Tensor:
        """The targets of this rank's positions of the rows."""
        targets = self.ids[:, 1:]
        if self.world.cp > 1:
            from opencomposer.distributed.context import split_sequence

            targets = split_sequence(targets, self.world.cp, self.world.cp_rank)
        return targets


def lm_step_loss(model: torch.nn.Module, data: StepData) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean next-token cross-entropy over the packed rows, plus the MoE load-balancing term (per
    rank and averaged over the ranks, as data-parallel MoE training does)."""
    aux_coef = getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0
    out = data.lm_forward(model)
    ce = target_nll(out.logits, data.lm_targets()).mean()
    loss = ce * data.lm_share
    metrics = {"lm_loss": loss.item()}
    if aux_coef > 0 and getattr(out, "aux_loss", None) is not None:
        loss = loss + aux_coef * out.aux_loss / data.world.size
        metrics["aux_loss"] = out.aux_loss.item()
    return loss, metrics


def sft_step_loss(model: torch.nn.Module, data: StepData) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean cross-entropy over the model-written tokens of the demonstration batch (the SFT loss)."""
    tokens = data.demo_tokens or int(data.demos.loss_mask.sum())
    loss = model_token_nll(model, data.demos, data.world, data.pad_id, data.bf16) / tokens
    return loss, {"sft_loss": loss.item(), "sft_tokens": tokens}


def mtp_step_loss(model: torch.nn.Module, data: StepData) -> tuple[torch.Tensor, dict[str, float]]:
    """Self-distillation of the MTP layers onto the main head (``model.mtp``): on the packed rows
    when the step has them (sharing the ``lm`` loss's forward), else on the demonstration rows
    whose targets are model tokens (the positions speculative decoding drafts). Normalised by the
    valid rows of every rank, so the ranks' parts add up to the whole batch's loss."""
    from opencomposer.model.mtp import mtp_distillation_loss

    world = data.world
    if data.ids is not None:
        out = data.lm_forward(model, grad=False)
        ids, positions, targets = data.ids[:, :-1], data.positions[:, :-1], None
    else:
        demos = data.demos
        ids, positions, targets = demos.input_ids, demos.position_ids, demos.loss_mask
        if world.cp > 1:
            from opencomposer.distributed.context import pad_batch_for_cp

            demos = pad_batch_for_cp(demos, world.cp, data.pad_id)
            ids, positions, targets = demos.input_ids, demos.position_ids, demos.loss_mask
        with torch.no_grad():
            if world.cp > 1:
                from opencomposer.distributed.context import cp_forward

                out = cp_forward(model, ids, positions, world.cp_group, hidden=True)
            else:
                out = model(input_ids=ids, position_ids=positions, use_cache=False, output_hidden_states=True)
    if world.cp > 1:
        from opencomposer.distributed.context import cp_mtp_distillation_loss

        return cp_mtp_distillation_loss(model, out.logits, out.hidden_states[-1], ids, positions, world.cp_group,
                                        targets=targets, count_group=None)
    reduce = world.all_reduce_sum if world.distributed else None
    return mtp_distillation_loss(model, out.logits, out.hidden_states[-1], ids, positions, targets=targets,
                                 reduce=reduce)


LOSSES: dict[str, Callable[[torch.nn.Module, StepData], tuple[torch.Tensor, dict[str, float]]]] = {
    "lm": lm_step_loss,
    "sft": sft_step_loss,
    "mtp": mtp_step_loss,
}


def model_token_nll(model: torch.nn.Module, batch: Any, world: World, pad_id: int, bf16: bool) -> torch.Tensor:
    """-Σ log π(token) over the model tokens of ``batch`` (this rank's positions of them under
    context parallelism)."""
    from opencomposer.training.forward import cp_token_logprobs, token_logprobs

    if world.cp > 1:
        from opencomposer.distributed.context import pad_batch_for_cp, split_batch

        batch = pad_batch_for_cp(batch, world.cp, pad_id)
        logprobs, _ = cp_token_logprobs(model, batch, world.cp_group, with_entropy=False, bf16=bf16)
        batch = split_batch(batch, world.cp, world.cp_rank)
    else:
        logprobs, _ = token_logprobs(model, batch, with_entropy=False, bf16=bf16,
                                     share_prefix=not world.distributed)
    return -torch.where(batch.loss_mask, logprobs, 0.0).sum()
