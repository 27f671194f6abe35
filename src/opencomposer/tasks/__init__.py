"""Tasks: the folder format and everything that makes or checks task folders.

- ``format``: ``load_task``/``load_suite``/``write_task`` (docs/task-format.md);
- ``importers``/``exporters``: HumanEval, SWE-bench and Harbor in, Harbor and SWE-bench predictions out;
- ``generators``: verified bug-injection, feature-deletion and refactor tasks, and the tiny family;
- ``mining``: tasks from a git history;
- ``validation``: re-grading gold and untouched states; ``stats``: sizes of a suite.

Not here: running an episode on a task (``episode``) or grading one (``grading.grade``); this
package sits above ``grading`` and uses them.
"""
