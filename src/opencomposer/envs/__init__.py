"""The runtime harness: ``grading.grade`` (hidden tests, rubric and lint in the sandbox, written as
``reward.json``) and ``rollout.run_episode`` (sandbox + agent loop + grading for one episode).

Not here: the sandbox itself (``sandbox``), task folders and generators (``tasks``).
"""
