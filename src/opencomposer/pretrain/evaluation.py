"""Held-out measurements of a run: loss on held-out code, the MTP layers' agreement, and the
retrieval, append and copy probes (docs/pretraining.md, "The retrieval probe").

``Evaluator`` holds what a run evaluates on, built once: held-out rows at each phase's length,
rows at the longest phase's length split at the first phase's (``heldout_near_loss``,
``heldout_far_loss``), and the probes: a file whose first line assigns a random value to a fresh
name and whose last line asks for it, at the longest length and within the first phase's; and
an append probe at each length a phase trains the ``append`` source at; and, when a phase trains
the ``copy`` source, copy probes (``probe_copy``): a span of the vocabulary's word pieces, a
newline, the same span, which only an induction circuit completes (a phase's ``until`` can wait
for it). Each is scored by greedy exact match of the answer's tokens, first-token accuracy and
mean log-probability.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Any

import numpy as np
import torch

from opencomposer.config.pretrain import PretrainConfig
from opencomposer.model.corpus import CodeFile, Corpus
from opencomposer.pretrain.data import documents, fixed_batches, seed_of
from opencomposer.pretrain.losses import token_losses
from opencomposer.pretrain.plan import Phase
from opencomposer.pretrain.recall import PROBE_WORDS, copy_documents, word_pieces
from opencomposer.pretrain.recall import SOURCES as GENERATED_SOURCES


class Evaluator:
    """The held-out sets of a run (module doc), and the evaluation row of a phase on them."""

    def __init__(self, corpus: Corpus, tokenizer: Any, separator: int, plan: list[Phase], settings: PretrainConfig,
                 probes: int, seed: int):
        self.corpus, self.tokenizer, self.separator = corpus, tokenizer, separator
        self.eval_batches = settings.eval_batches
        self.base_len = plan[0].config.seq_len
        long_len = max((p.config.seq_len for p in plan if p.lm), default=self.base_len)
        self.long = fixed_batches(corpus.heldout, tokenizer, separator, long_len, max(1, settings.batch_size // 2),
                                  self.eval_batches) if long_len > self.base_len and self.eval_batches else []
        self.sets: dict[int, list] = {}
        self.probes = probe_sets(corpus, tokenizer, plan, probes, seed)

    def __call__(self, model: torch.nn.Module, phase: Phase) -> dict[str, float]:
        """The held-out loss at the phase's length (and the MTP scores), the long rows' and the probes'."""
        from opencomposer.model.mtp import mtp_layers

        row: dict[str, float] = {}
        c = phase.config
        if phase.rows and self.eval_batches:
            if c.seq_len not in self.sets:
                self.sets[c.seq_len] = fixed_batches(self.corpus.heldout, self.tokenizer, self.separator, c.seq_len,
                                                     c.batch_size, self.eval_batches)
            if self.sets[c.seq_len]:
                row["heldout_loss"] = heldout_loss(model, self.sets[c.seq_len])["loss"]
                if mtp_layers(model):
                    row.update(heldout_mtp(model, self.sets[c.seq_len]))
        if self.long:
            scores = heldout_loss(model, self.long, beyond=self.base_len)
            row.update(heldout_long_loss=scores["loss"], heldout_near_loss=scores["near"],
                       heldout_far_loss=scores["far"])
        for label, subset in self.probes.items():
            for key, value in retrieval_probe(model, subset).items():
                row[f"{label}_{key}"] = value
        return row


def probe_sets(corpus: Corpus, tokenizer: Any, plan: list[Phase], count: int, seed: int) -> dict[str, list]:
    """``count`` probes of each kind the plan calls for (module doc), by the label of their metrics:
    ``probe_long`` and ``probe_short`` when phases differ in length, ``probe_append_<len>``,
    ``probe_copy`` when a phase trains the ``copy`` source."""
    if not count:
        return {}
    base_len = plan[0].config.seq_len
    long_len = max((p.config.seq_len for p in plan if p.lm), default=base_len)
    filler = corpus.heldout or [f for f in corpus.train if f.source not in GENERATED_SOURCES]
    sets: dict[str, list] = {}
    if long_len > base_len:
        sets["probe_long"] = probe_documents(tokenizer, filler, long_len, count, seed)
        with contextlib.suppress(ValueError):  # a first phase too short to hold a probe has no short one
            sets["probe_short"] = probe_documents(tokenizer, filler, base_len, count, seed)
    for length in sorted({p.config.seq_len for p in plan if p.lm and "append" in p.config.sources}):
        with contextlib.suppress(ValueError):
            sets[f"probe_append_{length}"] = append_probe_documents(tokenizer, filler, length, count, seed)
    if any(p.lm and "copy" in p.config.sources for p in plan):
        sets["probe_copy"] = copy_probe_documents(tokenizer, count, seed)
    return sets


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], beyond: int = 0
                 ) -> dict[str, float]:
    """Mean held-out cross-entropy; with ``beyond``, also at targets whose input position is below
    it (``near``) and at or past it (``far``), the positions a shorter phase never trained."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    losses, positions = [], []
    for ids, pos in batches:
        losses.append(token_losses(model, ids.to(device), pos.to(device)).cpu())
        positions.append(pos[:, :-1])
    model.train(was_training)
    loss, pos = torch.cat(losses), torch.cat(positions)
    out = {"loss": float(loss.mean())}
    if beyond:
        far = pos >= beyond
        out["near"] = float(loss[~far].mean()) if (~far).any() else float("nan")
        out["far"] = float(loss[far].mean()) if far.any() else float("nan")
        out["far_tokens"] = int(far.sum())
    return out


@torch.no_grad()
def heldout_mtp(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """The MTP layers on held-out rows: ``heldout_mtp_kl`` (the self-distillation loss) and
    ``heldout_mtp_top1`` (depth 1's argmax agreeing with the main head's: the acceptance rate of
    greedy speculative decoding), averaged over the batches."""
    from opencomposer.model.mtp import mtp_distillation_loss

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    kl, top1 = [], []
    for ids, pos in batches:
        ids, pos = ids.to(device), pos.to(device)
        out = model(input_ids=ids[:, :-1], position_ids=pos[:, :-1], use_cache=False, output_hidden_states=True)
        _, metrics = mtp_distillation_loss(model, out.logits, out.hidden_states[-1], ids[:, :-1], pos[:, :-1])
        kl.append(metrics["mtp_kl"])
        top1.append(metrics.get("mtp_top1_1", float("nan")))
    model.train(was_training)
    return {"heldout_mtp_kl": float(np.mean(kl)), "heldout_mtp_top1": float(np.mean(top1))}


def _probe_code(filler: list[CodeFile], tokenizer: Any, tokens: int, what: str) -> list[int]:
    """About ``tokens`` tokens of held-out code (whole documents) to fill probes with."""
    code: list[int] = []
    for doc in documents(filler, tokenizer):  # enough held-out code for every probe, no more
        code += doc
        if len(code) >= tokens:
            break
    if not code:
        raise ValueError(f"{what}: no held-out code to fill the probes with")
    return code


def probe_documents(tokenizer: Any, filler: list[CodeFile], length: int, count: int, seed: int = 0
                    ) -> list[tuple[list[int], int, int]]:
    """``count`` long-range retrieval probes of ``length`` tokens: (ids, start of the answer,
    distance). A probe is a file that assigns a random value to a fresh name in its first line,
    ``probe_name_K = "maple_onyx"``, continues with held-out code, and ends with ``assert
    probe_name_K == "``: the model should complete the value, which only the first line tells.
    Built in token space, so the answer's tokens are exactly those planted."""
    from opencomposer.model.tokenizer import document_separator_id

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rng = np.random.default_rng(seed_of(seed, "probe", length))
    code = _probe_code(filler, tokenizer, length * count, "retrieval probe")
    probes = []
    for k in range(count):
        name = f"probe_name_{k}"
        value = tok("_".join(rng.choice(PROBE_WORDS, size=2, replace=False)))
        head = [document_separator_id(tokenizer), *tok(f'{name} = "'), *value, *tok('"\n')]
        tail = tok(f'\nassert {name} == "')
        room = length - len(head) - len(tail) - len(value) + 1  # inputs: everything but the last answer token
        if room < 0:
            raise ValueError(f"retrieval probe: {length} tokens cannot hold a probe")
        start = int(rng.integers(0, max(1, len(code) - room)))
        filler_ids = (code * (1 + room // len(code)))[start : start + room]
        ids = head + filler_ids + tail + value
        probes.append((ids, len(head) + len(filler_ids) + len(tail), len(filler_ids) + len(tail) + 1))
    return probes


def append_probe_documents(tokenizer: Any, filler: list[CodeFile], length: int, count: int, seed: int = 0
                           ) -> list[tuple[list[int], int, int]]:
    """``count`` append probes of about ``length`` tokens, in ``probe_documents``' form (ids, start
    of the answer, distance). A probe assigns a fresh name a list of 1-4 probe words
    (``probe_list_K = "amber cobalt"``), continues with held-out code, marks a new word
    (``key: fjord``), continues with a third as much code and assigns the name again with the list
    copied (``probe_list_K = "amber cobalt``): the answer is the new word (`` fjord``), where
    copying the first assignment predicts the closing quote instead (``pretrain.recall``, the
    ``append`` source). Built in token space like the retrieval probe."""
    from opencomposer.model.tokenizer import document_separator_id

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rng = np.random.default_rng(seed_of(seed, "append-probe", length))
    code = _probe_code(filler, tokenizer, length * count, "append probe")
    probes = []
    for k in range(count):
        words = [str(w) for w in rng.choice(PROBE_WORDS, size=int(rng.integers(2, 6)), replace=False)]
        opening = tok(f'probe_list_{k} = "') + tok(words[0])
        for word in words[1:-1]:
            opening += tok(f" {word}")
        answer = tok(f" {words[-1]}")
        head = [document_separator_id(tokenizer), *opening, *tok('"\n')]
        mark = [*tok("\nkey:"), *answer, *tok("\n")]
        again = [*tok("\n"), *opening]
        room = length - len(head) - len(mark) - len(again) - len(answer) + 1
        if room < 4:
            raise ValueError(f"append probe: {length} tokens cannot hold a probe")
        far = room - room // 4  # the list ~3/4 of the row back, the word ~1/4
        start = int(rng.integers(0, max(1, len(code) - room)))
        spread = (code * (1 + room // len(code)))[start : start + room]
        ids = head + spread[:far] + mark + spread[far:] + again + answer
        probes.append((ids, len(ids) - len(answer), len(ids) - len(answer) - len(head) + 1))
    return probes


def copy_probe_documents(tokenizer: Any, count: int, seed: int = 0) -> list[tuple[list[int], int, int]]:
    """``count`` copy probes in ``probe_documents``' form: a document separator, a span of word
    pieces drawn as the ``copy`` source draws them (``recall.copy_documents``, from a stream of
    its own, so no probe is a training document), a newline and the span again, whose tokens are
    the answer. Built in token space: the answer repeats the first span's tokens exactly."""
    from opencomposer.model.tokenizer import document_separator_id

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    stream = zlib.crc32(f"copy-probe-{seed}".encode())
    probes = []
    for doc in copy_documents(word_pieces(tokenizer), count, stream):
        span = tok(doc.text.split("\n", 1)[0])
        head = [document_separator_id(tokenizer), *span, *tok("\n")]
        probes.append((head + span, len(head), len(head) - 1))
    return probes


@torch.no_grad()
def retrieval_probe(model: torch.nn.Module, probes: list[tuple[list[int], int, int]]) -> dict[str, float]:
    """Score probes: ``accuracy`` (the greedy completion is the planted value, every token of it:
    with the true prefix fed in, greedy decoding reproduces the value exactly when each of its
    tokens is the argmax), ``first_token`` (the value's first token is the argmax) and
    ``logprob`` (mean log-probability of the value's tokens)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    exact, first, logprob = [], [], []
    for ids, answer, _ in probes:
        tensor = torch.tensor([ids], device=device)
        logits = model(input_ids=tensor[:, :-1], position_ids=torch.arange(len(ids) - 1, device=device)[None],
                       use_cache=False).logits[0, answer - 1 :].float()
        target = tensor[0, answer:]
        exact.append(bool((logits.argmax(-1) == target).all()))
        first.append(bool(logits[0].argmax() == target[0]))
        logprob.append(float(torch.log_softmax(logits, -1).gather(-1, target[:, None]).mean()))
    model.train(was_training)
    return {"accuracy": float(np.mean(exact)), "first_token": float(np.mean(first)), "logprob": float(np.mean(logprob)),
            "distance": float(np.mean([d for _, _, d in probes]))}

