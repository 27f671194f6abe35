"""Each backend the project ships satisfies the protocol of its seam (``opencomposer.protocols``).

``runtime_checkable`` checks that the members exist; the signatures are compared here too, so a
backend that renames a parameter of a seam is caught before a caller trips over it.
"""

from __future__ import annotations

import inspect

import pytest

from opencomposer import protocols
from opencomposer.agent.policies.http import OpenAIPolicy
from opencomposer.agent.policies.local import EnginePolicy
from opencomposer.agent.policies.scripted import ScriptedPolicy
from opencomposer.config import SandboxConfig
from opencomposer.grading.grade import GradeCache
from opencomposer.inference.batching import BatchingSession
from opencomposer.inference.local import LocalEngine
from opencomposer.rl.sync import SyncRollouts
from opencomposer.rl.trainer import Trainer
from opencomposer.sandbox import Sandbox
from opencomposer.services.async_rl import AsyncRollouts
from opencomposer.services.episodes import EpisodeWorker
from opencomposer.services.evaluation import EvaluationService
from opencomposer.services.inference import InferenceService, RemoteInference, RemoteSession, ServiceSession
from opencomposer.services.inference_process import InferenceProcess
from opencomposer.services.ray_backend import EvaluationClient, RayInference, RemoteEpisodeWorker

IMPLEMENTATIONS = [
    (protocols.Engine, LocalEngine, ["generate", "load_weights"]),
    (protocols.Engine, BatchingSession, ["generate", "load_weights"]),
    (protocols.WeightSink, LocalEngine, ["load_weights"]),
    (protocols.Policy, EnginePolicy, ["act"]),
    (protocols.Policy, ScriptedPolicy, ["act"]),
    (protocols.Policy, OpenAIPolicy, ["act"]),
    (protocols.Workspace, Sandbox, ["run", "resolve", "relpath", "command_path", "diff", "close"]),
    (protocols.Grader, GradeCache, ["grade"]),
    (protocols.InferenceService, InferenceService, ["session", "load_weights"]),
    (protocols.Engine, ServiceSession, ["generate", "load_weights"]),
    (protocols.EpisodeWorker, EpisodeWorker, ["start", "close"]),
    (protocols.TrainerService, Trainer, ["score", "train", "publish"]),
    (protocols.EvaluationService, EvaluationService, ["submit", "poll", "close"]),
    (protocols.InferenceService, RemoteInference, ["session", "load_weights"]),
    (protocols.InferenceService, RayInference, ["session", "load_weights"]),
    (protocols.InferenceService, InferenceProcess, ["session", "load_weights"]),
    (protocols.Engine, RemoteSession, ["generate", "load_weights"]),
    (protocols.EpisodeWorker, RemoteEpisodeWorker, ["start", "close"]),
    (protocols.EvaluationService, EvaluationClient, ["submit", "poll", "close"]),
    *[(protocols.RolloutSource, source, ["open", "next_batch", "trained", "checkpointed", "publish", "versions",
                                         "evaluate", "evaluations", "close"]) for source in (SyncRollouts, AsyncRollouts)],
]


def parameters(func) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(func).parameters.values() if p.name != "self"]


@pytest.mark.parametrize(("protocol", "cls", "methods"), IMPLEMENTATIONS,
                         ids=[f"{c.__name__}-{p.__name__}" for p, c, _ in IMPLEMENTATIONS])
def test_backend_has_the_methods_of_its_seam(protocol, cls, methods):
    for name in methods:
        assert hasattr(protocol, name), f"{protocol.__name__} lost {name}"
        seam, backend = getattr(protocol, name), getattr(cls, name)
        ours, theirs = parameters(seam), dict(parameters(backend))
        positional = [n for n, kind in parameters(backend) if kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        for index, (param, kind) in enumerate(ours):
            # the seam's positional parameters come first and in order; its keyword-only ones exist
            ok = (positional[index: index + 1] == [param]) if kind is inspect.Parameter.POSITIONAL_OR_KEYWORD \
                else theirs.get(param) in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            assert ok, (f"{cls.__name__}.{name}{inspect.signature(backend)} does not take "
                        f"{protocol.__name__}.{name}{inspect.signature(seam)}: {param!r}")


def test_seams_hold_at_run_time(tmp_path):
    """Real objects pass the runtime_checkable isinstance checks."""
    (tmp_path / "a.txt").write_text("x\n")
    # the seam is the same without the jail, so this runs where bubblewrap cannot
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"), \
            Sandbox(tmp_path, SandboxConfig(isolation="none")) as sandbox:
        assert isinstance(sandbox, protocols.Workspace)
    assert isinstance(GradeCache(), protocols.Grader)
    assert isinstance(ScriptedPolicy([]), protocols.Policy)
    assert not isinstance(object(), protocols.Workspace)
    assert isinstance(SyncRollouts(), protocols.RolloutSource) and isinstance(AsyncRollouts(), protocols.RolloutSource)
