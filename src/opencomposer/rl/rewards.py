"""The episode reward: a sum of named, separately logged terms.

Report §4.2 (docs/recipe.md §4) describes two layers. **Functional**: correctness first, then
succinctness and software-engineering principles. **Behavioural**: coding style, communication
and product penalties: creating to-do items and leaving them unfinished, poor or broken tool
calls, and later chain-of-thought dumped into code comments and collapsing onto the terminal tool
only. The length penalty and (with ``rl.kl.placement = "reward"``) the KL penalty are subtracted.

    reward = resolved + fail_to_pass + pass_to_pass + succinctness + lint_added      (functional)
           + todo_unfinished + broken_tool_calls + reasoning_in_comments
           + run_tool_collapse + hack_suspected                                      (behavioural)
           + length_penalty + kl_penalty                                             (costs)

Each term is already signed (penalties are <= 0) and weighted by ``RewardConfig``; the returned
dict holds every term, and the terms sum to the total. Where the inputs come from:
- the grader's verdict, ``episode.grade`` (``types.Grade``): resolved, fail_to_pass, pass_to_pass,
  lines_changed, lint_added, hack_suspected (and todo_added when the diff text is missing);
- the episode's turns: unparseable turns, rejected tool calls, tool names;
- the agent's diff, ``episode.diff``, read by ``sandbox.patch.diff_stats``: to-dos left behind and
  reasoning in comments (comment lines as ``sandbox.patch.comment_text`` defines them).

Where we depart or fill gaps (the report names terms, never formulas or weights):
- Partial test credit (fail_to_pass) and a breakage penalty (pass_to_pass - 1) are small beside
  ``resolved``. Succinctness compares the diff with the task's reference change (the gold patch);
  without one there is no succinctness term. Counted penalties are capped (``count_cap``).
- To-dos "left unfinished" are TODO/FIXME/XXX markers the diff adds net of those it removes
  (we have no to-do tool; the final diff is where an unfinished to-do remains).
- "Reasoning in comments" is a pattern: added comment lines opening like narration ("Let me",
  "I think", "Wait", "Hmm", "The user", ...). It misses paraphrases; it is cheap and auditable.
- "Collapse onto the run tool" is binary: at least ``collapse_min_calls`` calls, all to ``run``.
- A suspected reward hack (``grading.hack_monitor``: a static scan of the diff for values that lie,
  frame introspection, swallowed exits, special-cased example inputs) costs ``hack_penalty`` once. It
  is a signal with a measured false-positive rate (``benchmarks/hack_monitor.py``), not a verdict,
  so it lowers the reward without zeroing it.
"""

from __future__ import annotations

import math
import re

from opencomposer.config import LengthPenaltyConfig, RewardConfig
from opencomposer.rl.length_penalty import length_features, length_penalty
from opencomposer.sandbox.patch import TODO_MARKER, comment_text, diff_stats
from opencomposer.types import Episode

_REASONING = re.compile(
    r"^(?:let me|let's|let us|i think|i'll|i will|i need to|i should|i'm going to|now i\b|first,? i\b|"
    r"wait\b|hmm|actually,|okay,? so|ok,? so|so the user|the user\b|the task\b|the instructions?\b|"
    r"looking at the|hold on)",
    re.IGNORECASE,
)


def unfinished_todos(diff: str) -> int:
    """TODO/FIXME/XXX markers the diff adds, net of the ones it removes (never negative)."""
    stats = diff_stats(diff)
    count = sum(len(TODO_MARKER.findall(text)) for _, text in stats.added())
    return max(0, count - sum(len(TODO_MARKER.findall(text)) for _, text in stats.removed()))


def reasoning_comment_lines(diff: str) -> int:
    """Added comment lines that open like the model narrating its reasoning."""
    texts = (comment_text(path, line) for path, line in diff_stats(diff).added())
    return sum(1 for text in texts if text and _REASONING.match(text))


def behaviour_counts(episode: Episode, run_tool: str = "run") -> dict[str, float]:
    """Raw counts behind the behavioural terms (uncapped, unweighted), for the reward and for logs."""
    turns = episode.turns
    tool_names = [call.name for turn in turns for call in turn.tool_calls]
    if episode.diff is not None:
        todos = unfinished_todos(episode.diff)
        reasoning = reasoning_comment_lines(episode.diff)
    else:
        todos = episode.grade.todo_added if episode.grade is not None else 0
        reasoning = 0
    return {
        "todo_unfinished": float(todos),
        "broken_tool_calls": float(
            sum((turn.format_error is not None) + turn.rejected_tool_calls for turn in turns)
        ),
        "reasoning_in_comments": float(reasoning),
        "tool_calls": float(len(tool_names)),
        "run_tool_calls": float(sum(name == run_tool for name in tool_names)),
    }


def episode_reward(
    episode: Episode,
    weights: RewardConfig,
    length: LengthPenaltyConfig,
    *,
    kl_penalty: float = 0.0,
    reference_lines_changed: float | None = None,
) -> tuple[float, dict[str, float]]:
    """The reward of one scored episode and its named terms (each signed and weighted).

    ``kl_penalty`` is coef·Σ_t k1 for this episode (``kl.sequence_kl_penalty``) when the KL sits in
    the reward, else 0. ``reference_lines_changed`` is the size of the task's reference change
    (``diff_stats(task.gold_patch).lines_changed``), None when the task has none.
    """
    if not episode.scored:
        raise ValueError(
            f"episode of task {episode.task_id!r} is an infrastructure failure; it is never scored"
        )
    grade = episode.grade
    if grade is None:
        raise ValueError(f"episode of task {episode.task_id!r} has no grade; only graded episodes are scored")
    cap = weights.count_cap
    counts = behaviour_counts(episode, weights.run_tool)
    terms: dict[str, float] = {}
    terms["resolved"] = weights.resolved * float(grade.resolved)
    terms["fail_to_pass"] = weights.fail_to_pass * grade.fail_to_pass
    terms["pass_to_pass"] = weights.pass_to_pass * (grade.pass_to_pass - 1.0)
    if reference_lines_changed is None or weights.succinctness == 0.0:
        terms["succinctness"] = 0.0
    else:
        ratio = (grade.lines_changed + 1.0) / (reference_lines_changed + 1.0)
        terms["succinctness"] = -weights.succinctness * math.log1p(
            max(0.0, ratio - weights.succinctness_slack)
        )
    terms["lint_added"] = -weights.lint_added * min(max(grade.lint_added, 0), cap)
    terms["todo_unfinished"] = -weights.todo_unfinished * min(counts["todo_unfinished"], cap)
    terms["broken_tool_calls"] = -weights.broken_tool_calls * min(counts["broken_tool_calls"], cap)
    terms["reasoning_in_comments"] = -weights.reasoning_in_comments * min(
        counts["reasoning_in_comments"], cap
    )
    collapsed = (
        counts["tool_calls"] >= weights.collapse_min_calls
        and counts["run_tool_calls"] == counts["tool_calls"]
    )
    terms["run_tool_collapse"] = -weights.run_tool_collapse * float(collapsed)
    terms["hack_suspected"] = -weights.hack_penalty * float(grade.hack_suspected)
    x = length_features(episode, length)
    terms["length_penalty"] = -length.coef * float(length_penalty(x, length.k, length.q))
    terms["kl_penalty"] = -float(kl_penalty)
    return float(sum(terms.values())), terms
