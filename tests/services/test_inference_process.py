"""The inference service in a child process (``services.inference_process``): it samples exactly
what the in-process service samples, follows the weight store, comes back after SIGKILL at the
newest version, and never outlives the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.config import Config
from opencomposer.types import SamplingParams


def exited(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def same(a, b) -> None:
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.logprobs for c in a] == [c.logprobs for c in b]
    assert [c.policy_version for c in a] == [c.policy_version for c in b]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.routed_experts, y.routed_experts)
        assert np.array_equal(x.prompt_routed_experts, y.prompt_routed_experts)


def test_the_inference_process_samples_as_the_service_does_and_comes_back_after_a_kill(tmp_path: Path, tiny_moe):
    import copy

    from opencomposer.model.loading import save_checkpoint
    from opencomposer.services.inference import InferenceService
    from opencomposer.services.inference_process import InferenceProcess
    from opencomposer.services.weights import WeightStore

    model, tokenizer = tiny_moe
    model = copy.deepcopy(model)
    save_checkpoint(model, tokenizer, tmp_path / "initial")
    store = WeightStore(tmp_path / "weights")
    store.publish({k: v.detach().clone() for k, v in model.state_dict().items()}, 0)
    config = Config()
    # the child on as many torch threads as this process: another count sums in another order,
    # and the logprobs compared bit for bit below would differ in the last place
    config.run.threads = torch.get_num_threads()
    local = InferenceService(model, tokenizer, 0, lambda: (store.load(store.latest()), store.latest()), inference=config)
    remote = InferenceProcess(str(tmp_path / "initial"), config, store.url, 0, tokenizer)
    try:
        prompts = [tokenizer.encode("def add(a, b):\n"), tokenizer.encode("import os\n")]
        params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
        assert remote.max_positions == local.max_positions
        same(remote.session().generate(prompts, params, 2), local.session().generate(prompts, params, 2))

        # a new version: published, then switched to by name (no weights travel to the child)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        store.publish(state, 1)
        local.load_weights(state, 1)
        remote.load_weights(state, 1)
        assert remote.policy_version == 1
        after = remote.session().generate(prompts, params, 2)
        same(after, local.session().generate(prompts, params, 2))

        # killed: the next call starts a new child at the newest version and answers the same
        killed = remote.pid
        os.kill(killed, signal.SIGKILL)
        session = remote.for_owner("env-0").session()
        same(session.generate(prompts, params, 2), after)
        assert remote.pid != killed and remote.process_restarts == 1 and remote.restarts == 1
        assert remote.policy_version == 1
        session.close()

        # a child that dies and cannot be replaced is a RuntimeError (an episode's infrastructure
        # failure), not a connection error escaping into the worker
        import shutil

        shutil.rmtree(tmp_path / "initial")
        os.kill(remote.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="did not start"):
            remote.session()
    finally:
        remote.close()
    assert exited(remote.pid, 10.0)


def test_the_inference_process_exits_with_a_killed_parent(tmp_path: Path, tiny_moe):
    """A trainer killed with SIGKILL never calls ``close``; its inference process must not stay."""
    from opencomposer.model.loading import save_checkpoint
    from opencomposer.services.weights import WeightStore

    model, tokenizer = tiny_moe
    save_checkpoint(model, tokenizer, tmp_path / "initial")
    WeightStore(tmp_path / "weights").publish({k: v.detach().clone() for k, v in model.state_dict().items()}, 0)
    script = textwrap.dedent(f"""
        import sys, time
        from opencomposer.config import Config
        from opencomposer.model.loading import load_model
        from opencomposer.config import ModelConfig
        from opencomposer.services.inference_process import InferenceProcess
        if __name__ == "__main__":
            _, tokenizer = load_model(ModelConfig(kind="hf", path={str(tmp_path / "initial")!r}))
            process = InferenceProcess({str(tmp_path / "initial")!r}, Config(), {str(tmp_path / "weights")!r}, 0,
                                       tokenizer)
            print(process.pid, flush=True)
            time.sleep(600)
    """)
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        child = int(parent.stdout.readline())
        assert not exited(child, 0.5)
        parent.kill()
        parent.wait()
        assert exited(child, 10.0), f"the inference process {child} outlived its parent"
    finally:
        parent.kill()


def test_the_inference_process_is_an_embedded_backend_setting():
    from opencomposer.config import ConfigError, load_recipe

    with pytest.raises(ConfigError, match="services.inference_process: applies to the embedded backend"):
        load_recipe(None, ["services.inference_process=true", "services.backend=ray"])


def test_a_dead_engine_is_closed_before_the_next_one_starts(monkeypatch):
    """vLLM keeps one model-parallel state (and its GPU memory) per process: the service closes a
    dead engine before it builds the next, and a close that fails does not stop the restart."""
    from opencomposer.services import inference as service_module
    from opencomposer.services.faults import EngineDied
    from opencomposer.types import Completion

    events: list[str] = []

    class Engine:
        policy_version, max_positions, tokenizer = 0, 64, None

        def __init__(self, number: int):
            self.number = number
            events.append(f"build {number}")

        def generate(self, prompts, params, n=1, row_seeds=None):
            if self.number < 3:
                raise EngineDied(f"engine {self.number} died")
            return [Completion([1], [0.0], "length")]

        def close(self):
            events.append(f"close {self.number}")
            if self.number == 2:
                raise RuntimeError("the GPU is gone")

    built = iter(range(1, 10))
    monkeypatch.setattr(service_module, "make_engine", lambda *args, **kwargs: Engine(next(built)))
    model = torch.nn.Linear(2, 2)
    service = service_module.InferenceService(model, None, 0, lambda: (model.state_dict(), 0))
    with service.session() as session:
        [c] = session.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    assert c.token_ids == [1] and service.restarts == 2
    assert events == ["build 1", "close 1", "build 2", "close 2", "build 3"]


def test_a_service_process_samples_on_the_run_device(tmp_path: Path, tiny_moe, monkeypatch):
    """``load_policy`` (the policy of the inference process and of the Ray actors): on ``run.device``
    for the in-process sampler, on the CPU for vLLM's template and in a Ray actor given no GPU; a
    ``run.device = "cuda"`` that the process cannot have is an error, not a quiet CPU run."""
    import opencomposer.model.device as device_module
    from opencomposer.config import ConfigError, load_recipe
    from opencomposer.model.loading import save_checkpoint
    from opencomposer.services.inference import load_policy

    model, tokenizer = tiny_moe
    save_checkpoint(model, tokenizer, tmp_path / "initial")
    asked = []
    resolve = device_module.resolve_device
    monkeypatch.setattr(device_module, "resolve_device", lambda name: asked.append(name) or resolve(name))
    policy, _ = load_policy(str(tmp_path / "initial"), load_recipe(None, ["run.device=cpu"]))
    assert asked == ["cpu"] and next(policy.parameters()).device.type == "cpu"
    policy, _ = load_policy(str(tmp_path / "initial"), load_recipe(None, ["inference.backend=vllm"]))
    assert asked == ["cpu"]  # vLLM loads the saved folder itself: the template stays on the CPU
    policy, _ = load_policy(str(tmp_path / "initial"), load_recipe(None, ["run.device=cuda"]), gpu=False)
    assert asked == ["cpu"] and next(policy.parameters()).device.type == "cpu"  # a Ray actor given no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="run.device = 'cuda', but torch sees no CUDA device"):
        load_policy(str(tmp_path / "initial"), load_recipe(None, ["run.device=cuda"]))
