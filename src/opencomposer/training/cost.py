"""What a run cost (issue 38 §4): tokens per stage, model FLOPs, wall and device time, peak memory,
and the same in device-hours and dollars. Every pretraining, SFT, RL and evaluation run keeps a
``CostMeter``, writes ``{run}/cost.json`` and puts the table on its ``report.html``.

**Tokens**, per stage: ``pretraining`` (language-model positions trained), ``sft``
(demonstration positions trained), ``trained`` (RL positions trained), ``reference`` (RL positions
scored by the frozen KL reference, forward only), and on the sampler's side ``prefilled`` (context
positions it computed), ``cached`` (context positions it took from its cache: no FLOPs) and
``sampled`` (tokens it generated). The sampler's side is counted from the episodes, as an engine
that keeps an episode's keys and values from one turn to the next does the work: a segment's first
turn prefills its prompt, every later turn only the tool output since the one before, and the rest
of its context is cached. An engine that also shares a prompt's prefill between the samples of a
group does less; one without a cache does more.

**FLOPs** (the report gives none; the accounting is PaLM's, appendix B, with active parameters for
mixture-of-experts). N is the active parameters per token: every matrix a token is multiplied by
(attention projections, the dense MLP or its ``top_k`` of the routed experts, shared experts, the
router, the output head), not the input embedding (a lookup) nor norms and biases; L the layers and
W = query heads × head dimension. A row of T positions costs

    forward:             2·N·T + 4·L·W·T²       (QKᵀ and AV over every key of the row)
    forward + backward:  6·N·T + 12·L·W·T²      (the backward pass is twice the forward)

so ``pretraining``, ``sft`` and ``trained`` rows cost the second, ``reference`` rows the first. On
the sampler, n new context positions after c cached ones cost 2·N·n + 4·L·W·n·(c + n), and n
sampled tokens after a context of c cost 2·N·n + 4·L·W·(n·c + n(n + 1)/2) (token j attends to
c + j keys). The attention term counts the full square a masked kernel computes; a causal kernel
that skips the masked half does about half of it. ``tests/training/test_cost.py`` checks the
formula against ``torch.utils.flop_counter.FlopCounterMode`` on the tiny MoE (eager attention and
experts, so that every matrix product is an op the counter sees). A model behind an API
(``eval`` of a hosted policy) has no known N: its tokens are counted, its FLOPs are not.

**Time and memory.** ``wall_s`` from the meter's start to ``write``; ``device_s`` = wall_s × the
devices the run held (a data-parallel group's size); ``cpu_s`` the process's user and system time
(``resource.getrusage``), with ``children_cpu_s`` for what its subprocesses used (sandboxes,
graders); peak memory ``torch.cuda.max_memory_allocated`` on a GPU, the process's maximum resident
set (``ru_maxrss``) on a CPU. A resumed run adds to the ``cost.json`` it finds (its replayed steps
were paid for again); peak memory is the larger.

**Dollars** = device_s / 3600 × ``run.cost_per_hour`` (or ``config.run.DEVICE_PRICES`` of
``run.cost_device``).

Not here: what a hosted policy's API charged (``Budgets.max_cost``, the agent's own account).
"""

from __future__ import annotations

import html
import json
import resource
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opencomposer.config.run import DEVICE_PRICES, RunConfig
from opencomposer.io import atomic_write_text

if TYPE_CHECKING:
    import torch

    from opencomposer.training.html import HtmlReport
    from opencomposer.types import Episode

COST_FILE = "cost.json"
STAGES = ("pretraining", "sft", "trained", "reference", "prefilled", "cached", "sampled")
FORMULA = (
    "FLOPs per row of T positions: forward 2·N·T + 4·L·W·T², forward + backward 6·N·T + 12·L·W·T²; "
    "n positions prefilled after c cached: 2·N·n + 4·L·W·n·(c + n); n tokens sampled after a context of c: "
    "2·N·n + 4·L·W·(n·c + n(n+1)/2). N: active parameters per token, L: layers, W: query heads × head dim.\n"
    "device-hours = wall seconds × devices / 3600; dollars = device-hours × price per device-hour."
)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP formula needs of a model (module doc)."""

    active_params: int  # N
    layers: int  # L
    attention_width: int  # W = query heads × head dim

    def forward(self, positions: int, keys: float) -> float:
        """FLOPs of ``positions`` positions each attending to ``keys`` keys on average, forward."""
        return 2.0 * self.active_params * positions + 4.0 * self.layers * self.attention_width * positions * keys


def model_shape(model: torch.nn.Module) -> ModelShape:
    """N, L and W of a transformers causal LM (module doc); routed experts (a parameter under a
    module named ``experts``) count ``top_k / num_experts`` of their size."""
    config = model.config
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    experts = getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    active = 0.0
    for name, parameter in model.named_parameters():
        if parameter.ndim < 2 or parameter is embedding or name.startswith("mtp"):
            continue
        routed = ".experts." in name and experts and top_k
        active += parameter.numel() * (top_k / experts if routed else 1.0)
    if head is not None and head.weight is embedding:  # tied: the head's product is still made
        active += embedding.numel()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelShape(int(round(active)), config.num_hidden_layers, heads * head_dim)


def resolve_device_name(run: RunConfig) -> str:
    """``run.cost_device``, or for ``auto`` the device this process computes on: ``cpu``, or the
    GPU's table name when its model name contains one (else the model name itself)."""
    if run.cost_device != "auto":
        return run.cost_device
    import torch

    if run.device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    gpu = torch.cuda.get_device_name()
    return next((name for name in DEVICE_PRICES if name != "cpu" and name in gpu), gpu)


def price_per_hour(run: RunConfig, device: str) -> float | None:
    """Dollars per device-hour: ``run.cost_per_hour``, else the table's; None when neither knows."""
    return run.cost_per_hour or DEVICE_PRICES.get(device)


class CostMeter:
    """Counts a run's tokens and FLOPs as its loop reports them; ``write`` adds time and memory.

    ``kind``: ``pretrain``, ``sft``, ``rl`` or ``eval``; ``model``: None when the policy is not a
    local model (no FLOPs); ``devices``: how many the run holds (its data-parallel group)."""

    def __init__(self, kind: str, run: RunConfig, model: torch.nn.Module | None = None, devices: int = 1):
        self.kind, self.run, self.devices = kind, run, devices
        self.shape = model_shape(model) if model is not None else None
        self.tokens = dict.fromkeys(STAGES, 0)
        self.flops = dict.fromkeys(STAGES, 0.0)
        self.started = time.perf_counter()
        self.cpu_started = _cpu_seconds()
        self.earlier: dict[str, Any] | None = None  # cost.json of the processes before a resume

    def resume(self, folder: Path) -> None:
        """Add to the ``cost.json`` an earlier process of this run left in ``folder``."""
        path = Path(folder) / COST_FILE
        if path.is_file():
            self.earlier = json.loads(path.read_text())

    def train_rows(self, stage: str, lengths: Iterable[int]) -> None:
        """Rows of these lengths went forward and backward (``pretraining``, ``sft``, ``trained``)."""
        for length in lengths:
            self._add(stage, length, 3.0 * self.shape.forward(length, length) if self.shape else 0.0)

    def forward_rows(self, stage: str, lengths: Iterable[int]) -> None:
        """Rows of these lengths went forward only (``reference``)."""
        for length in lengths:
            self._add(stage, length, self.shape.forward(length, length) if self.shape else 0.0)

    def episode(self, episode: Episode) -> None:
        """The sampler's work for one episode (module doc: a cache kept between turns)."""
        for segment in episode.segments:
            context, new = 0, len(segment.prompt_ids)
            for turn in segment.turns:
                self._add("cached", context, 0.0)
                self._add("prefilled", new, self.shape.forward(new, context + new) if self.shape else 0.0)
                context += new
                sampled = len(turn.token_ids)
                self._add("sampled", sampled, self.shape.forward(sampled, context + (sampled + 1) / 2)
                          if self.shape else 0.0)
                context += sampled
                new = len(turn.observation_ids)

    def _add(self, stage: str, tokens: int, flops: float) -> None:
        if stage not in self.tokens:
            raise ValueError(f"cost stage {stage!r}: expected one of {', '.join(STAGES)}")
        self.tokens[stage] += int(tokens)
        self.flops[stage] += flops

    def summary(self) -> dict[str, Any]:
        """This run's cost so far, those of earlier processes of it included (the cost.json)."""
        import torch

        wall_s = time.perf_counter() - self.started
        cpu_s, children_s = (now - then for now, then in zip(_cpu_seconds(), self.cpu_started, strict=True))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak, source = int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
        else:  # ru_maxrss: kibibytes on Linux, bytes on macOS
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
            source = "ru_maxrss"
        earlier = self.earlier or {}
        before = earlier.get("tokens", {})
        tokens = {stage: self.tokens[stage] + int(before.get(stage, 0)) for stage in STAGES}
        flops = {stage: self.flops[stage] + float((earlier.get("flops") or {}).get(stage, 0.0)) for stage in STAGES}
        device_s = wall_s * self.devices + float(earlier.get("device_s", 0.0))
        device = resolve_device_name(self.run)
        price = price_per_hour(self.run, device)
        device_hours = device_s / 3600.0
        return {
            "kind": self.kind,
            "model": None if self.shape is None else {"active_params": self.shape.active_params,
                                                      "layers": self.shape.layers,
                                                      "attention_width": self.shape.attention_width},
            "tokens": tokens,
            "flops": {**flops, "total": sum(flops.values())} if self.shape else None,
            "wall_s": wall_s + float(earlier.get("wall_s", 0.0)),
            "devices": self.devices,
            "device_s": device_s,
            "cpu_s": cpu_s + float(earlier.get("cpu_s", 0.0)),
            "children_cpu_s": children_s + float(earlier.get("children_cpu_s", 0.0)),
            "peak_memory_bytes": max(peak, int(earlier.get("peak_memory_bytes", 0))),
            "peak_memory_source": source,
            "device": device,
            "price_per_hour": price,
            "device_hours": device_hours,
            "dollars": None if price is None else device_hours * price,
            "processes": 1 + int(earlier.get("processes", 0)),
        }

    def write(self, folder: Path) -> dict[str, Any]:
        """Write ``{folder}/cost.json``; returns what it holds."""
        cost = self.summary()
        atomic_write_text(Path(folder) / COST_FILE, json.dumps(cost, indent=1) + "\n")
        return cost


def _cpu_seconds() -> tuple[float, float]:
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime, children.ru_utime + children.ru_stime


def cost_rows(cost: dict[str, Any]) -> list[list[str]]:
    """The cost table, one ``[quantity, value]`` per row (for ``report.html`` and ``cost_table_html``)."""
    rows = [[f"tokens: {stage}", f"{count:,}"] for stage, count in cost["tokens"].items() if count]
    if cost["flops"] is not None:
        rows += [[f"FLOPs: {stage}", f"{value:.3e}"] for stage, value in cost["flops"].items() if value]
        model = cost["model"]
        rows.append(["model: N active, L, W", f"{model['active_params']:,}, {model['layers']}, {model['attention_width']}"])
    rows += [
        ["wall time", f"{cost['wall_s']:.1f} s"],
        ["device time", f"{cost['device_s']:.1f} s on {cost['devices']} × {cost['device']}"],
        ["CPU time (process; subprocesses)", f"{cost['cpu_s']:.1f} s; {cost['children_cpu_s']:.1f} s"],
        ["peak memory", f"{cost['peak_memory_bytes'] / 2**20:,.0f} MiB ({cost['peak_memory_source']})"],
        ["device-hours", f"{cost['device_hours']:.4f}"],
        ["price per device-hour", "unknown" if cost["price_per_hour"] is None else f"${cost['price_per_hour']:.2f}"],
        ["dollars", "unknown" if cost["dollars"] is None else f"${cost['dollars']:.4f}"],
    ]
    return rows


def cost_section(report: HtmlReport, cost: dict[str, Any]) -> None:
    """Add a "Cost" section to an ``HtmlReport``: the table and the formula."""
    report.section("cost", "Cost")
    report.table(["quantity", "value"], cost_rows(cost))
    report.code(FORMULA, caption="How it is computed (opencomposer.training.cost)")


def cost_table_html(cost: dict[str, Any]) -> str:
    """The same table and formula as an HTML fragment, for a page not built with ``HtmlReport``."""
    body = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(value)}</td></tr>"
                   for name, value in cost_rows(cost))
    return (f"<table><tr><th>quantity</th><th>value</th></tr>{body}</table>\n"
            f"<pre>{html.escape(FORMULA)}</pre>")


def write_cost_report(folder: Path, cost: dict[str, Any], title: str) -> Path:
    """``{folder}/report.html`` with the cost section, for runs whose folder has no other page."""
    from opencomposer.training.html import HtmlReport

    report = HtmlReport(title)
    cost_section(report, cost)
    return report.write(Path(folder) / "report.html")


def finish(meter: CostMeter, folder: Path, title: str) -> dict[str, Any]:
    """``cost.json`` and ``report.html`` in ``folder``: what a run calls when it ends."""
    cost = meter.write(folder)
    write_cost_report(folder, cost, title)
    return cost
