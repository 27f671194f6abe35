"""The runtime harness: ``grading.grade`` (hidden tests, rubric and lint in the sandbox; a
``types.Grade``, written as ``reward.json``), ``testrun.run_tests`` (the one pytest runner, which
grading and the task generators share, with its recording plugin ``pytest_plugin``),
``integrity.secure_workspace`` (the test infrastructure put back before the hidden tests run) and
``rollout.run_episode`` (sandbox + agent loop + grading for one episode).

Not here: the sandbox itself (``sandbox``), task folders and generators (``tasks``).
"""
