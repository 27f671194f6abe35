"""Whatever files the agent leaves, its diff is graded, never dropped as an infrastructure error.

A file the diff could not carry used to make grading fail as an infrastructure error, which
silently dropped the rollout (and let a policy escape a failing score). Now every file the agent
can make round-trips (``tests/sandbox/test_patch_round_trip.py``), and a diff that would not is a
harness bug that ``run_episode`` reports loudly and works around by grading the workspace itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from opencomposer.agent.policies.scripted import ScriptedPolicy, call
from opencomposer.config import Config
from opencomposer.grading.grade import GradeCache
from opencomposer.episode import run_episode
from opencomposer.sandbox import patch
from opencomposer.tasks.format import load_task
from opencomposer.types import EpisodeStatus

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"
FIX = call("edit", path="calc.py", old="    return a - b\n", new="    return a + b\n")
ODD_FILES = (  # everything a policy can leave in its workspace that a line-based diff could not carry
    "printf 'a\\r\\nb\\014c\\342\\200\\250d' > crlf.txt; printf '\\000\\377\\376' > blob.bin; "
    "ln -s /etc/passwd leak; ln -s missing dangling; chmod +x calc.py; : > empty; "
    "printf x > \"$(printf 'na me\\t\\\"q\\\\\\303\\251\\nz')\"; printf y > \"$(printf 'bad\\377')\"; "
    "rm tests/test_mul.py"
)


@pytest.mark.bwrap
def test_odd_files_in_the_workspace_are_graded_like_any_change():
    task = load_task(FIXTURES / "fix-add")
    policy = ScriptedPolicy([[call("run", command=ODD_FILES), FIX]])
    episode = run_episode(task, policy, Config())
    assert episode.status == EpisodeStatus.OK, episode.error
    assert episode.grade.resolved and not episode.grade.diff_round_trip_failed
    assert {"crlf.txt", "blob.bin", "leak", "dangling", "calc.py", "empty", "na me\t\"q\\é\nz",
            "bad\udcff", "tests/test_mul.py"} <= set(patch.diff_stats(episode.diff).paths)
    assert "GIT binary patch" in episode.diff and "new file mode 120000" in episode.diff


@pytest.mark.bwrap
def test_a_diff_that_fails_its_round_trip_is_graded_from_the_workspace(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture):
    real_file_diff = patch.file_diff

    def lossy(rel, old, new, *modes):  # a planted harness bug: the diff writes another fix than the file's
        return real_file_diff(rel, old, None if new is None else new.replace("a + b", "a * b"), *modes)

    monkeypatch.setattr(patch, "file_diff", lossy)
    task = load_task(FIXTURES / "fix-add")
    cache = GradeCache()
    with caplog.at_level(logging.ERROR, logger="opencomposer.episode"):
        episode = run_episode(task, ScriptedPolicy([[FIX]]), Config(), grader=cache.grade)
    assert episode.status == EpisodeStatus.OK, episode.error
    assert "+    return a * b" in episode.diff  # the wrong diff is kept as it was made, for the bug report
    # graded from the workspace (a + b): the diff alone (a * b) would have failed test_add
    assert episode.grade.resolved and episode.grade.diff_round_trip_failed and episode.reward == 1.0
    assert episode.grade.lines_changed == 2 and (cache.hits, cache.misses) == (0, 0)  # measured, never cached
    assert any("harness bug: the diff of" in r.getMessage() and "'calc.py'" in r.getMessage() for r in caplog.records)
