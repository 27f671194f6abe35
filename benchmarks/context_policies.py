"""Context policies side by side on the long family: what survives a full context, at what cost.

The report's claim (§4.1; blog "Training Composer for longer horizons"): self-summarisation beats
a tuned prompt-based compaction, with half its error at a fifth of the tokens. Here the same model
and the same held-out ``tiny-long`` tasks run under each ``agent.context_policy`` at two triggers:

- the agent's work turns are the oracle's walkthrough (read each note in its own turn, then write),
  so every policy faces the same context at the same moments (``--agent oracle``, the default);
  or the model plays every turn (``--agent model``, for a policy trained on the family: the
  hidden test decides, and ``resolved`` is the measure, over ``--samples`` episodes a task);
- every summary is the model's: with ``self_summary`` the model answers the short request at the
  end of its own context (greedy, up to ``--summary-tokens``); with ``compaction`` it answers the
  long fixed compaction prompt over the transcript in a separate call (up to
  ``--compaction-tokens``); ``truncate`` drops the oldest tool outputs and writes nothing.

What is measured per episode (the facts are the K key words, one per note):

- ``answerable``: every key word is in what the agent can see when it writes the answer (the
  summary it resumed from and the reads since; truncation: the outputs still in context);
- ``resolved``: the hidden test passes (with ``--agent oracle`` it follows ``answerable``);
- ``model_tokens``: every token the model wrote in the episode (work turns, summaries, compactions);
- ``retention``: over the segments after the first, the share of the words read before the
  segment began that its opening holds (the summary, or the surviving tool outputs);
- ``spurious``: the same share for the sixteen-word vocabulary's words the task does not use (a
  summary that lists words at random scores here too: the floor to read ``retention`` against);
- ``plan``: the share of those segments that open with exactly the notes still to read;
- ``summary_tokens`` (model-written summary or compaction tokens), ``compaction_prompt_tokens``
  (prefill of the separate compaction calls), ``summary_prefill_reused`` (context a prefix cache
  holds for a self-summary call), seconds.

``off`` is listed as the reference: the window ends the episode before the answer.

    .venv/bin/python benchmarks/context_policies.py [--model smollm2 --tasks 4 --threads 2]
    .venv/bin/python benchmarks/context_policies.py --model runs/tiny-long --agent model --samples 4
    .venv/bin/python benchmarks/context_policies.py --quick   # one task, the random tiny MoE summarising

Results: ``benchmarks/results/context_policies.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _quick import parse_args

from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.agent.policies.scripted import ScriptedPolicy, oracle_script
from opencomposer.config import load_recipe
from opencomposer.episode import run_episode
from opencomposer.inference import LocalEngine
from opencomposer.model.loading import load_model
from opencomposer.tasks.generators.long import (
    mentions,
    message_facts,
    summary_plan,
    summary_retention,
    summary_spurious,
)
from opencomposer.tasks.generators.tiny import tiny_spec, write_tiny_task
from opencomposer.types import Context, Episode, PolicyOutput

POLICIES = ("off", "truncate", "compaction", "self_summary")
QUICK = {"model": "tiny_moe", "tasks": 1, "summary_tokens": 16, "compaction_tokens": 16}


class ModelSummaries:
    """The oracle's walkthrough for work turns; the model for every summary (self-summary turns and
    compaction calls, both asked with ``Context.summary``)."""

    def __init__(self, oracle: ScriptedPolicy, model: EnginePolicy):
        self.oracle, self.model = oracle, model
        self.name = f"oracle+{model.name}-summaries"
        self.tokenizer = oracle.tokenizer
        self.max_context = model.max_context

    def act(self, context: Context) -> PolicyOutput:
        return self.model.act(context) if context.summary else self.oracle.act(context)


def visible_at_write(segment: Any) -> str:
    """What the last segment shows the agent before its write turn: its opening and its reads."""
    seen = []
    for m in segment.messages[2:]:
        if m.role == "assistant" and "write_file" in m.content:
            break
        seen.append(m)
    return message_facts(seen)


def measure(episode: Episode, words: tuple[str, ...]) -> dict[str, float]:
    wrote = any(c.name == "write_file" for t in episode.turns for c in t.tool_calls)
    answerable = wrote and all(mentions(visible_at_write(episode.segments[-1]), w) for w in words)
    m = episode.metrics
    return {
        "answerable": float(answerable),
        "resolved": float(episode.grade.resolved) if episode.grade is not None else float("nan"),
        # turns hold work and self-summary tokens; compaction calls are side calls, counted apart
        "model_tokens": float(sum(len(t.token_ids) for t in episode.turns)) + m.get("compaction_tokens", 0.0),
        "retention": summary_retention(episode, words),
        "spurious": summary_spurious(episode, words),
        "plan": summary_plan(episode, words),
        "segments": m.get("segments", 1.0),
        "summaries": m.get("summaries", 0.0),
        "summary_tokens": m.get("summary_tokens", 0.0),
        "compaction_prompt_tokens": m.get("compaction_prompt_tokens", 0.0),
        "summary_prefill_reused": m.get("summary_prefill_reused", 0.0),
        "seconds": m.get("wall_s", 0.0),
    }


def sizes(tasks: list[Any], tokenizer: Any, config: Any) -> tuple[int, int]:
    """The first prompt's tokens and the largest context one read adds, from an oracle run."""
    episode = run_episode(tasks[0], ScriptedPolicy(oracle_script, tokenizer=tokenizer), config)
    turns = [t for t in episode.turns if any(c.name == "read_file" for c in t.tool_calls)]
    return len(episode.segments[0].prompt_ids), max(len(t.token_ids) + len(t.observation_ids) for t in turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="model kind or checkpoint folder (default smollm2)")
    parser.add_argument("--tasks", type=int, default=4, help="held-out tiny-long tasks")
    parser.add_argument("--summary-tokens", type=int, default=256)
    parser.add_argument("--compaction-tokens", type=int, default=512)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--agent", choices=("oracle", "model"), default="oracle",
                        help="who plays the work turns: the oracle's walkthrough, or the model (module doc)")
    parser.add_argument("--samples", type=int, default=1, help="episodes per task and policy with --agent model")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the model's turns")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--out", type=Path, help="results JSON; the plot goes beside it "
                                                 "(default: benchmarks/results/context_policies.json)")
    args = parse_args(parser, QUICK)
    if args.out is None:
        args.out = args.results_dir / "context_policies.json"
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, seed=0)
    model.float()
    # one episode at a time: the batch-invariant decoder's fixed tiles would pad each single row
    engine = LocalEngine(model, tokenizer, batch_invariant=False)
    if args.samples < 1 or (args.samples > 1 and args.agent == "oracle"):
        parser.error("--samples: at least 1, and more than 1 only with --agent model (the oracle is deterministic)")
    base = ["grading.lint=false", f"sampling.temperature={args.temperature}",
            f"agent.summary_max_tokens={args.summary_tokens}", f"agent.compaction_max_tokens={args.compaction_tokens}"]
    config = load_recipe(None, base)
    summarizer = EnginePolicy(engine, tokenizer, config.sampling, name=str(args.model))
    with tempfile.TemporaryDirectory() as tmp:
        specs = [tiny_spec(0, "heldout", i, "tiny-long") for i in range(args.tasks)]
        tasks = [write_tiny_task(Path(tmp) / f"task-{i}", spec) for i, spec in enumerate(specs)]
        for task in tasks:  # the family's wall budget is sized for the tiny model, not a 135M one on a CPU
            task.budgets.max_wall_s = None
        prompt, read = sizes(tasks, tokenizer, config)
        # a window that holds the prompt, two reads, the summary request and the summary; triggers
        # after one read of a fresh segment ("tight") and after two ("loose")
        window = prompt + 2 * read + args.summary_tokens + 300
        triggers = {"tight": prompt + read - 20, "loose": prompt + 2 * read - 20}
        print(f"prompt {prompt} tokens, one read up to {read}; window {window}; triggers {triggers}")
        rows = []
        for trigger_name, trigger in triggers.items():
            for policy_name in args.policies:
                if policy_name == "off" and trigger_name == "loose":
                    continue  # the trigger does not apply
                overrides = [*base, f"agent.context_window={window}", f"agent.context_policy={policy_name}",
                             f"agent.summary_trigger_tokens={trigger}"]
                run_config = load_recipe(None, overrides)
                for (spec, task), sample in itertools.product(zip(specs, tasks, strict=True), range(args.samples)):
                    oracle = ScriptedPolicy(oracle_script, tokenizer=tokenizer)
                    agent = summarizer if args.agent == "model" else ModelSummaries(oracle, summarizer)
                    started = time.perf_counter()
                    episode = run_episode(task, agent, run_config, seed=sample, sample_index=sample)
                    row = {"policy": policy_name, "trigger": trigger_name, "task": task.id, "sample": sample,
                           "k": len(spec.words), "status": episode.status.value, **measure(episode, spec.words),
                           "seconds": time.perf_counter() - started, "summary_texts": episode.summaries}
                    rows.append(row)
                    print(f"{trigger_name:5s} {policy_name:12s} {task.id} ({row['status']}): "
                          f"resolved {row['resolved']:.0f} answerable {row['answerable']:.0f} "
                          f"retention {row['retention']:.2f} spurious {row['spurious']:.2f} "
                          f"summary tokens {row['summary_tokens']:.0f} ({row['seconds']:.0f} s)")
    table = summarise(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "agent": args.agent, "samples": args.samples,
                                    "temperature": args.temperature, "window": window, "triggers": triggers,
                                    "prompt_tokens": prompt, "read_tokens": read, "table": table, "rows": rows},
                                   indent=1) + "\n")
    plot(table, args.out.with_suffix(".png"), args.agent)
    print_table(table)
    print(f"wrote {args.out} and its plot")


def print_table(table: list[dict[str, Any]]) -> None:
    names = ("episodes", "resolved", "answerable", "retention", "spurious", "plan", "summary_tokens", "model_tokens")
    print(f"\n{'trigger':<8} {'policy':<13} " + " ".join(f"{name:>14}" for name in names))
    for entry in table:
        print(f"{entry['trigger']:<8} {entry['policy']:<13} " + " ".join(f"{entry[name]:>14.2f}" for name in names))


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for key in dict.fromkeys((r["trigger"], r["policy"]) for r in rows):
        group = [r for r in rows if (r["trigger"], r["policy"]) == key]
        entry = {"trigger": key[0], "policy": key[1], "episodes": len(group)}
        for name in ("resolved", "answerable", "model_tokens", "retention", "spurious", "plan", "summaries",
                     "summary_tokens", "compaction_prompt_tokens", "summary_prefill_reused", "seconds"):
            values = [r[name] for r in group if not np.isnan(r[name])]
            entry[name] = float(np.mean(values)) if values else float("nan")
        out.append(entry)
    return out


def plot(table: list[dict[str, Any]], path: Path, agent: str = "oracle") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outcome = "resolved" if agent == "model" else "answerable"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for trigger, marker in (("tight", "o"), ("loose", "s")):
        for entry in (e for e in table if e["trigger"] == trigger):
            label = f"{entry['policy']} ({trigger})"
            axes[0].scatter(entry["summary_tokens"], entry["retention"], marker=marker, s=60)
            axes[0].annotate(label, (entry["summary_tokens"], entry["retention"]),
                             fontsize=8, xytext=(4, 4), textcoords="offset points")
            axes[1].bar(f"{entry['policy']} ({trigger})", entry[outcome])
            axes[2].scatter(entry["model_tokens"], entry[outcome], marker=marker, s=60)
            axes[2].annotate(label, (entry["model_tokens"], entry[outcome]),
                             fontsize=8, xytext=(4, 4), textcoords="offset points")
    axes[0].set_xlabel("summary tokens per episode (model-written)")
    axes[0].set_ylabel("facts retained at each new segment")
    axes[0].set_title("what a fresh segment still knows")
    axes[1].set_ylim(0, 1)
    axes[1].set_ylabel(f"share of episodes {'resolved' if agent == 'model' else 'whose answer is in view at the write'}")
    axes[1].set_title(outcome)
    axes[1].tick_params(axis="x", labelsize=7, labelrotation=35)
    for label in axes[1].get_xticklabels():
        label.set_horizontalalignment("right")
    axes[2].set_xlabel("model-written tokens per episode")
    axes[2].set_ylabel(outcome)
    axes[2].set_ylim(-0.05, 1.05)
    axes[2].set_title(f"{outcome} against tokens ({'the model plays' if agent == 'model' else 'oracle work turns'})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
