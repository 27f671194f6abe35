"""The named-term reward (report §4.2): a golden episode with every term worked out by hand,
diff parsing, and the edge cases of each behavioural term."""

import dataclasses
import math

import pytest

from opencomposer.config import LengthPenaltyConfig, RewardConfig
from opencomposer.rl import behaviour_counts, episode_reward
from opencomposer.rl.rewards import reasoning_comment_lines, unfinished_todos
from opencomposer.sandbox.patch import diff_stats
from opencomposer.types import Episode, EpisodeStatus, Grade, Segment, TokenKind, ToolCall, Turn

APP_DIFF = """\
diff --git a/src/app.py b/src/app.py
--- a/src/app.py
+++ b/src/app.py
@@ -1,3 +1,8 @@
 import os
-# TODO: old marker
+# Let me fix the rounding here first
+def f(x):
+    # TODO: handle negatives
+    # The user wants two decimals
+    # We need to copy here because of aliasing
+    return round(x, 2)  # FIXME later
 x = 1
"""

OTHER_DIFF = """\
diff --git a/db/schema.sql b/db/schema.sql
--- a/db/schema.sql
+++ b/db/schema.sql
@@ -1,2 +1,2 @@
--- TODO drop this table
+-- renamed table
 CREATE TABLE t (id int);
diff --git a/web/ui.js b/web/ui.js
new file mode 100644
--- /dev/null
+++ b/web/ui.js
@@ -0,0 +1,2 @@
+// wait, this breaks on null
+const a = 1; // TODO
\\ No newline at end of file
"""


def test_diff_lines_uses_hunk_counts():
    stats = diff_stats(OTHER_DIFF)
    assert stats.removed() == [("db/schema.sql", "-- TODO drop this table")]  # not a file header
    assert stats.added() == [
        ("db/schema.sql", "-- renamed table"),
        ("web/ui.js", "// wait, this breaks on null"),
        ("web/ui.js", "const a = 1; // TODO"),
    ]
    assert diff_stats(APP_DIFF).lines_changed == 7
    assert unfinished_todos(APP_DIFF) == 1  # TODO + FIXME added, one TODO removed
    assert unfinished_todos(OTHER_DIFF) == 0  # one added, one removed
    # "Let me ..." and "The user ..." read as narration; "We need to copy ..." is an ordinary comment
    assert reasoning_comment_lines(APP_DIFF) == 2
    assert reasoning_comment_lines(OTHER_DIFF) == 1  # the // comment in ui.js


def _turn(n_thinking, n_call, n_final, observation, calls=(), format_error=None, rejected=0):
    kinds = (
        [TokenKind.THINKING] * n_thinking
        + [TokenKind.TOOL_CALL] * n_call
        + [TokenKind.FINAL_MESSAGE] * n_final
    )
    return Turn(
        token_ids=[7] * len(kinds),
        logprobs=[-0.5] * len(kinds),
        token_kinds=kinds,
        tool_calls=[ToolCall(name, {}) for name in calls],
        observation_ids=[9] * observation,
        observation_kinds=[TokenKind.TOOL_OUTPUT] * observation,
        format_error=format_error,
        rejected_tool_calls=rejected,
    )


def _grade(**numbers) -> Grade:
    """A grade with the given numbers; the rest (which the reward does not read) are plausible."""
    defaults = dict(tests_passed=3, tests_failed=1, tests_errored=0, test_exit_code=1, test_timed_out=False,
                    rubric_ok=True, files_changed=1, lines_added=6, lines_removed=1, todo_added=2,
                    comment_lines_added=4, grading_s=1.5)
    return Grade(**{**defaults, **numbers})


def _episode(**overrides):
    fields = dict(
        task_id="t",
        segments=[
            Segment(
                prompt_ids=[1] * 40,
                turns=[
                    _turn(100, 20, 0, 300, calls=("run", "run"), rejected=1),
                    _turn(50, 10, 0, 0, calls=("run",), format_error="unparseable JSON"),
                    _turn(30, 0, 25, 0),
                ],
            )
        ],
        grade=_grade(resolved=False, fail_to_pass=0.5, pass_to_pass=0.75, lines_changed=29, lint_added=7),
        diff=APP_DIFF,
    )
    fields.update(overrides)
    return Episode(**fields)


def test_golden_episode_every_term():
    weights, length = RewardConfig(), LengthPenaltyConfig()  # the recipe defaults
    total, terms = episode_reward(_episode(), weights, length, kl_penalty=0.03, reference_lines_changed=4)
    # x: 180 thinking + 30 tool-call + 300·0.1 tool-output + 25 final + 10·3 calls + 100·3 turns = 595
    x = 180 + 30 + 30 + 25 + 30 + 300
    c = 2.0 * (math.sqrt(1.0 + 1e-3 * x) - 1.0) / 1e-3  # q = 1/2 closed form
    expected = {
        "resolved": 0.0,
        "fail_to_pass": 0.1 * 0.5,
        "pass_to_pass": 0.1 * (0.75 - 1.0),
        "succinctness": -0.05 * math.log1p((29 + 1) / (4 + 1) - 2.0),
        "lint_added": -0.02 * 5,  # 7 findings, capped at 5
        "todo_unfinished": -0.05 * 1,
        "broken_tool_calls": -0.05 * 2,  # one rejected call, one unparseable turn
        "reasoning_in_comments": -0.05 * 2,
        "run_tool_collapse": -0.1,  # three calls, all to run
        "hack_suspected": 0.0,
        "length_penalty": -1e-5 * c,
        "kl_penalty": -0.03,
    }
    assert terms.keys() == expected.keys()
    for name, value in expected.items():
        assert terms[name] == pytest.approx(value, rel=1e-12, abs=1e-15), name
    assert total == pytest.approx(sum(expected.values()), rel=1e-12)
    assert total == pytest.approx(-0.5407306, abs=1e-7)


def test_resolved_clean_episode_scores_near_one():
    clean = _episode(
        segments=[Segment(prompt_ids=[1], turns=[_turn(10, 5, 0, 20, calls=("edit",)), _turn(0, 0, 5, 0)])],
        grade=_grade(resolved=True, fail_to_pass=1.0, pass_to_pass=1.0, lines_changed=3, lint_added=0),
        diff="",
    )
    total, terms = episode_reward(clean, RewardConfig(), LengthPenaltyConfig(), reference_lines_changed=4)
    assert [name for name, value in terms.items() if value < 0] == ["length_penalty"]
    assert total == pytest.approx(1.0 + 0.1 + terms["length_penalty"], rel=1e-12)


@pytest.mark.parametrize(
    ("calls", "collapsed"),
    [(("run", "run", "run"), True), (("run", "run"), False), (("run", "read", "run"), False), ((), False)],
)
def test_run_tool_collapse(calls, collapsed):
    episode = _episode(segments=[Segment(prompt_ids=[], turns=[_turn(1, 1, 0, 0, calls=calls)])])
    _, terms = episode_reward(episode, RewardConfig(), LengthPenaltyConfig())
    assert terms["run_tool_collapse"] == (-0.1 if collapsed else 0.0)


def test_counts_are_capped_and_uncapped_counts_are_logged():
    episode = _episode(
        segments=[Segment(prompt_ids=[], turns=[_turn(1, 1, 0, 0, calls=("edit",), rejected=12)])]
    )
    _, terms = episode_reward(episode, RewardConfig(count_cap=3), LengthPenaltyConfig())
    assert terms["broken_tool_calls"] == pytest.approx(-0.05 * 3)
    assert behaviour_counts(episode)["broken_tool_calls"] == 12.0


def test_without_diff_text_todos_come_from_the_grader_and_without_reference_no_succinctness():
    episode = _episode(diff=None, grade=dataclasses.replace(_episode().grade, todo_added=4))
    _, terms = episode_reward(episode, RewardConfig(), LengthPenaltyConfig())
    assert terms["todo_unfinished"] == pytest.approx(-0.2)
    assert terms["reasoning_in_comments"] == 0.0
    assert terms["succinctness"] == 0.0


def test_infra_errors_are_never_scored():
    with pytest.raises(ValueError, match="never scored"):
        episode_reward(_episode(status=EpisodeStatus.INFRA_ERROR), RewardConfig(), LengthPenaltyConfig())


def test_an_episode_without_a_grade_is_never_scored():
    with pytest.raises(ValueError, match="has no grade"):
        episode_reward(_episode(grade=None), RewardConfig(), LengthPenaltyConfig())
    _, terms = episode_reward(_episode(), RewardConfig(lint_added=0.0), LengthPenaltyConfig())
    assert terms["lint_added"] == 0.0


def test_a_suspected_hack_costs_the_hack_penalty_once_and_resolved_stands():
    clean = _episode(grade=_grade(resolved=True, fail_to_pass=1.0, pass_to_pass=1.0, lines_changed=3, lint_added=0))
    flagged = _episode(grade=dataclasses.replace(clean.grade, hack_suspected=True,
                                                 hack_reasons=("introspection solution.py:3: sys._getframe",)))
    base, base_terms = episode_reward(clean, RewardConfig(), LengthPenaltyConfig())
    total, terms = episode_reward(flagged, RewardConfig(), LengthPenaltyConfig())
    assert (base_terms["hack_suspected"], terms["hack_suspected"]) == (0.0, -0.5)  # the default penalty
    assert total == pytest.approx(base - 0.5) and terms["resolved"] == base_terms["resolved"] == 1.0
    _, weighted = episode_reward(flagged, RewardConfig(hack_penalty=0.2), LengthPenaltyConfig())
    assert weighted["hack_suspected"] == pytest.approx(-0.2)
    _, off = episode_reward(flagged, RewardConfig(hack_penalty=0.0), LengthPenaltyConfig())
    assert off["hack_suspected"] == 0.0


def test_the_hack_penalty_is_validated():
    from opencomposer.config import ConfigError

    with pytest.raises(ConfigError, match="hack_penalty"):
        RewardConfig(hack_penalty=-0.1).validate()
