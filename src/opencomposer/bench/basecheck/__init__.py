"""Base-model selection checks (docs/recipe.md §2, report appendix B): three cheap measurements that
say which base model to start continued pretraining from, deliberately not agent benchmarks.

- ``nll``: **codebase NLL** (``codebase_nll_per_byte``, lower is better), nats per UTF-8 byte of
  held-out repositories under a rolling window;
- ``state``: **state tracking** (``state_tracking_distance``, lower is better; LoCoDiff-like), the
  normalised edit distance between the file a model writes from its history of diffs and the
  true final file;
- ``fresh``: **FreshBench-like QA** (``freshbench_accuracy``, higher is better), multiple-choice
  questions about the source of the installed dependencies.

``run_basecheck`` runs the three on each model (``tiny_moe`` = an untrained tiny MoE, ``smollm2``,
any checkpoint folder) over data built once for all models, so the numbers compare; the sizes are
the recipe's ``[basecheck]`` (``config.basecheck``). ``common`` holds what the checks share:
loading the models, the comparison table and the JSON file.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass

from opencomposer.bench.basecheck.common import (
    BasecheckError,
    check_model_spec,
    load_checked_model,
    model_context,
    results_table,
    write_results,
)
from opencomposer.bench.basecheck.fresh import Question, freshbench, generate_questions
from opencomposer.bench.basecheck.nll import codebase_nll, repository_texts
from opencomposer.bench.basecheck.state import FileHistory, collect_histories, state_tracking
from opencomposer.config import BasecheckConfig

__all__ = ["BasecheckError", "results_table", "run_basecheck", "write_results"]


@dataclass
class BasecheckData:
    """What every model is measured on, built once: repository texts, histories, questions."""

    repos: list[tuple[str, str]]
    histories: list[FileHistory]
    questions: list[Question]


def prepare(settings: BasecheckConfig, progress: bool = False) -> BasecheckData:
    """Build the shared data; raises BasecheckError on a bad repository or package, or too little data."""
    repos = repository_texts(settings.nll_repos, settings.nll_bytes)
    histories = collect_histories(settings)
    questions = generate_questions(settings.questions, settings.seed, settings.candidates, settings.packages,
                                   progress=progress)
    return BasecheckData(repos, histories, questions)


def check_model(spec: str, data: BasecheckData, settings: BasecheckConfig, progress: bool = False) -> dict:
    """The three checks on one model; the three headline keys first, then ``detail``."""
    import torch

    started = time.perf_counter()
    model, tokenizer = load_checked_model(spec, settings.seed, settings.device)
    context = model_context(model)
    window = min(settings.window or context, context)
    stride = settings.stride if settings.stride and settings.stride < window else max(window // 2, 1)
    timings = {}
    t = time.perf_counter()
    nll = codebase_nll(model, tokenizer, data.repos, window, stride, progress)
    timings["codebase_nll"] = time.perf_counter() - t
    t = time.perf_counter()
    state = state_tracking(model, tokenizer, data.histories, progress)
    timings["state_tracking"] = time.perf_counter() - t
    t = time.perf_counter()
    fresh = freshbench(model, tokenizer, data.questions, progress)
    timings["freshbench"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - started
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "codebase_nll_per_byte": nll["nll_per_byte"],
        "state_tracking_distance": state["distance"],
        "freshbench_accuracy": fresh["accuracy"],
        "detail": {"parameters": parameters, "context": context, "seconds": timings,
                   "codebase_nll": nll, "state_tracking": state, "freshbench": fresh,
                   "settings": asdict(settings)},
    }


def run_basecheck(specs: list[str], settings: BasecheckConfig, progress: bool = False) -> dict[str, dict]:
    """Every model's results, keyed by its spec as given; inputs are checked before any model loads."""
    if not specs:
        raise BasecheckError("--model: name at least one model")
    duplicates = sorted(s for s, n in Counter(specs).items() if n > 1)
    if duplicates:
        raise BasecheckError(f"--model: given more than once: {', '.join(duplicates)}")
    for spec in specs:
        check_model_spec(spec)
    data = prepare(settings, progress)
    import torch

    threads = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        return {spec: check_model(spec, data, settings, progress) for spec in specs}
    finally:
        torch.set_num_threads(threads)
