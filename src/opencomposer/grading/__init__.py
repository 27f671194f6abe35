"""Grading: ``grade.grade`` (hidden tests, rubric and lint in the sandbox; a
``types.Grade``, written as ``reward.json``), ``testrun.run_tests`` (the one pytest runner, which
grading and the task generators share, with its recording plugin ``pytest_plugin``),
``integrity.secure_workspace`` (the test infrastructure put back before the hidden tests run),
and ``hack_monitor.scan_diff`` (a static scan of the diff for reward-hacking patterns: a signal in
``reward.json``, never a verdict).

Not here: the sandbox itself and the per-task virtual environments (``sandbox``, ``sandbox.venv``),
one episode end to end (``episode``), task folders and generators (``tasks``).
"""
