"""``services.inference_process = true``: the embedded backend's inference service in a child process.

A child process (spawned, so it starts without the trainer's threads) hosts the same
``InferenceHost`` the Ray inference actor hosts, built from the run's ``initial`` folder and
following the weight store; the episode workers stay threads of the trainer's process, and
their sessions are calls into the child over ``multiprocessing.managers``, which gives every
calling thread its own connection and a serving thread of its own in the child, so the G
episodes of a group still batch together. What it buys is isolation: the sampler's memory, a
crash or a kill no longer take the trainer with them, and the Ray actor's code runs without Ray.
It does not buy throughput on two cores: the trainer there loses cores, not the interpreter
(docs/LOG.md, 2026-12-05, sync vs async throughput).

**Restarts.** A call that finds the child gone (its connection breaks and the process has exited)
starts a new child at the newest published version and issues the call again, as Ray re-issues a
call to a restarted actor: the sessions open before it reopen at their next call, with the seeds
their requests carry, so no episode sees the failure and no group is sampled twice.
``restarts`` counts process restarts plus engine restarts inside the child.

**Faults.** ``kill_inference`` in a fault plan (``services.faults``) kills the child with SIGKILL
just before the planned ``generate`` call, so the fault tests exercise a real process death (its
``after`` counts the sessions' calls here, the batched engine calls in the in-thread service).
Not detected: a child that is alive but never answers blocks its callers, as a hung Ray actor
does; only a death is seen. The child loads the policy on CPU, as the Ray actor does.

**Lifetime.** ``close()`` stops the child; a child whose parent dies (a killed trainer) notices
within a second and exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.managers import BaseManager
from typing import Any

from opencomposer.services.faults import FaultPlan, fire
from opencomposer.services.inference import InferenceHost, RemoteInference

log = logging.getLogger(__name__)

# What a call sees when the child is gone: the connection ends (EOF) or breaks or cannot be
# made (BrokenPipeError, ConnectionResetError, ConnectionRefusedError, FileNotFoundError: all
# OSError). Whether the child really is gone is checked before restarting it.
LOST = (EOFError, OSError)
EXIT_WAIT_S = 5.0  # how long a broken connection waits for the child's exit before calling it alive
MAX_RESTARTS_PER_CALL = 3


class _Manager(BaseManager):
    pass


_Manager.register("InferenceHost", InferenceHost)


def _child_setup(parent: int, cpus: set[int]) -> None:
    """In the child, before it serves: run on ``cpus`` (those of the thread that first started it,
    whichever thread restarts it), and exit when the parent process is gone (a killed trainer
    never calls ``close``)."""
    os.sched_setaffinity(0, cpus)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class InferenceProcess(RemoteInference):
    """The inference service in a child process (see module doc): an ``InferenceService`` whose
    sessions are owned by ``owner``; ``for_owner`` gives each episode worker a view of the
    same process under its own name."""

    def __init__(self, folder: str, config: Any, store_url: str, version: int, tokenizer: Any, *,
                 faults: FaultPlan | None = None, owner: str = "trainer"):
        self.folder, self.config, self.store_url, self.faults = folder, config, store_url, faults
        self._lock = threading.Lock()  # the fields below
        self._closed = False
        self.process_restarts = 0
        self.cpus = os.sched_getaffinity(0)  # the child's CPUs, on a restart too
        self.generation = 0  # bumped by each restart, so concurrent callers restart once
        self._manager, self._host, self._pid = self._start(version)
        super().__init__(self._call, owner, tokenizer)

    def _start(self, version: int | None) -> tuple[_Manager, Any, int]:
        manager = _Manager(ctx=multiprocessing.get_context("spawn"))
        manager.start(initializer=_child_setup, initargs=(os.getpid(), self.cpus))
        try:
            host = manager.InferenceHost(self.folder, self.config, self.store_url, version)
            return manager, host, host.pid()
        except BaseException:
            manager.shutdown()
            raise

    @property
    def pid(self) -> int:
        """The child's process id (the one a restart replaced, until the restart is done)."""
        return self._pid

    def _call(self, method: str, *args: Any) -> Any:
        for _ in range(MAX_RESTARTS_PER_CALL):
            with self._lock:
                if self._closed:
                    raise RuntimeError("the inference process is closed")
                host, generation, pid = self._host, self.generation, self._pid
            if method == "generate" and fire(self.faults, "kill_inference"):
                self._kill(generation)
            try:
                return getattr(host, method)(*args)
            except LOST as e:
                # a RuntimeError, as the in-thread service raises: the episode's policy reports it
                # as an infrastructure failure (retried), not a crash of its worker
                if not self._restart(generation, e):
                    raise RuntimeError(f"the inference process (pid {pid}) cannot be reached: {e!r}") from e
        raise RuntimeError(f"the inference process died {MAX_RESTARTS_PER_CALL} times under one {method} call")

    def _kill(self, generation: int) -> None:
        """SIGKILL the child of ``generation`` (the ``kill_inference`` fault), unless it was replaced."""
        with self._lock:
            if self.generation == generation and not self._closed:
                try:
                    os.kill(self._pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _restart(self, generation: int, error: BaseException) -> bool:
        """A new child once the current one has exited (unless another caller already made one);
        False when the run is closing or the child is still alive (the error was something else)."""
        with self._lock:
            if self._closed:
                return False
            if self.generation != generation:
                return True
            process = self._manager._process  # BaseManager's server process
            process.join(EXIT_WAIT_S)
            if process.is_alive():
                return False
            log.warning("the inference process (pid %d) exited (code %s, seen as %r); restarting it at the "
                        "newest published version", self._pid, process.exitcode, error)
            self._manager.shutdown()
            try:
                self._manager, self._host, self._pid = self._start(None)
            except Exception as e:  # noqa: BLE001 (reported to the caller as the service being gone)
                raise RuntimeError(f"the inference process exited and a new one did not start: {e!r}") from e
            self.generation += 1
            self.process_restarts += 1
            return True

    @property
    def restarts(self) -> int:
        """Process restarts, plus engine restarts inside the current child."""
        engine_restarts = self._call("restarts")
        return self.process_restarts + engine_restarts

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            manager, self._host = self._manager, None
        manager.shutdown()
