"""The evaluation service: the held-out suite on chosen policy versions, beside training.

The trainer asks for version v (every ``rl.eval_every`` versions, the first and the last); the
service loads v from the weight store into an engine of its own and runs ``rl.evaluate`` on the
fixed seed set, in a thread of its own, so training never waits for an evaluation (except at
the very end of the run, for the evaluations still owed). Results come back through ``poll``.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from opencomposer.config import Config
from opencomposer.inference.batching import BatchingEngine
from opencomposer.inference.factory import make_engine
from opencomposer.model.attention import restore_attention
from opencomposer.numerics.convert import convert_model
from opencomposer.types import Task


class EvaluationService:
    """See module doc; ``load(version)`` returns that version's state dict (the weight store's)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, config: Config, tasks: list[Task],
                 load: Callable[[int], dict[str, torch.Tensor]], grader: Callable[..., Any]):
        engine_model = restore_attention(copy.deepcopy(model)).eval()
        convert_model(engine_model, config.numerics)  # as the trainer's policy (a no-op on a converted copy)
        self.engine = make_engine(config, engine_model, tokenizer, for_training=True)  # [inference] backend
        self.batcher = BatchingEngine(self.engine, max_wait_s=config.inference.batch_wait_s)
        self.tokenizer, self.config, self.tasks = tokenizer, config, tasks
        self.load, self.grader = load, grader
        self._todo: queue.Queue[int | None] = queue.Queue()
        self._done: queue.Queue[tuple[int, dict[str, float] | BaseException]] = queue.Queue()
        self.pending = 0
        self._thread = threading.Thread(target=self._serve, name="evaluation", daemon=True)
        self._thread.start()

    def submit(self, version: int) -> None:
        self.pending += 1
        self._todo.put(version)

    def _serve(self) -> None:
        from opencomposer.rl.evaluate import evaluate

        while (version := self._todo.get()) is not None:
            try:
                self.batcher.load_weights(self.load(version), version)
                metrics = evaluate(self.tasks, self.batcher, self.tokenizer, self.config, grader=self.grader)
                self._done.put((version, metrics))
            except BaseException as e:  # noqa: BLE001 (reported to the driver, which raises it)
                self._done.put((version, e))

    def poll(self, wait: bool = False) -> list[tuple[int, dict[str, float]]]:
        """Finished evaluations, oldest first; ``wait`` blocks until none is pending."""
        out = []
        while self.pending:
            try:
                version, result = self._done.get(block=wait)
            except queue.Empty:
                break
            self.pending -= 1
            if isinstance(result, BaseException):
                raise RuntimeError(f"the evaluation of policy version {version} failed: {result}") from result
            out.append((version, result))
        return out

    def close(self) -> None:
        self._todo.put(None)
