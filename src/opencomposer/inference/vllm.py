"""vLLM as an ``Engine``: ``VLLMEngine`` (vLLM's offline engine in this process) and ``HttpEngine``
(vLLM's OpenAI-compatible server, or any server with the same token-id extensions).

Both are chosen with ``[inference] backend`` through ``inference.factory.make_engine``. vLLM is
imported lazily: this module imports without it, and asking for it without it installed raises
``VLLMUnavailable`` with the install command (the ``gpu`` extra, in a separate virtual
environment: docs/gpu.md).

**VLLMEngine** drives ``vllm.LLM``'s engine one scheduler step at a time
(``llm.llm_engine.add_request`` / ``step``), which is what ``LLM.generate`` does internally, so
that it can act between two steps:

- *Token ids in, token ids out.* Each prompt goes in as ``{"prompt_token_ids": ...}``; the
  completion is vLLM's ``CompletionOutput.token_ids``, EOS or stop token included, as
  ``LocalEngine`` returns them. Stop strings are kept in the output
  (``include_stop_str_in_output``), as the project's ``SamplingParams`` says.
- *Which log-probabilities.* The ``LLM`` is built with ``logprobs_mode="processed_logprobs"`` and
  every request asks for ``logprobs=0`` (the sampled token's only). vLLM's sampler (its V1 model
  runner's, or the V2 runner's, the default on CUDA) then returns, for the sampled token, the
  log-softmax of the logits after its processing: penalties and logit bias (none are set
  here), temperature, min-p (0 here), then the top-k / top-p mask,
  i.e. ``log π_cut`` of ``inference.sampling``, the distribution the token was drawn from and the
  one the trainer scores. At temperature 0 (greedy) vLLM returns the log-softmax of the
  unscaled logits, as ``LocalEngine`` does. vLLM's default, ``raw_logprobs``, would be the full
  softmax at temperature 1, which is *not* the project's convention (the ratio and the k1 KL
  would be off-policy by ``-log(kept mass)``). Two differences remain and are measured, not
  hidden, by the importance ratio like any sampler/trainer gap: vLLM's kernels (bf16 matmuls,
  paged attention) round differently from the trainer's forward, and its top-p rule breaks ties
  and rounds the cumulative mass in its own order.
- *n samples, row seeds, prefill sharing.* Every (prompt, sample) row is one vLLM request with
  ``n=1`` and its own ``seed`` (``LocalEngine``'s ``row_seed(seed, i, j)``, or the caller's
  ``row_seeds``), so a ``BatchingEngine`` in front gives each episode the seeds it would have
  alone. vLLM's own ``n > 1`` fans out into n requests the same way; the n rows of a prompt share
  its prefill through vLLM's prefix cache (``inference.enable_prefix_caching``, on by default),
  which also serves a group's shared prompt and an agent's growing context: vLLM finds the
  blocks of a row added in the same step as another row of the prompt, so rows after the first
  prefill only what follows the last whole block they share. ``prompt_tokens`` and
  ``cached_prompt_tokens`` count what was asked and what the cache served. vLLM seeds its
  sampler per request, but its logits depend on the batch (no batch invariance): the same seed
  gives the same tokens only up to that.
- *Routed experts.* vLLM versions that have ``enable_return_routed_experts`` (vLLM PR 28284,
  "rollout router replay") return ``CompletionOutput.routed_experts``, the top-k expert ids of
  every position it ran, read from its KV slots (prefix-cache hits included). The first
  ``len(prompt)`` rows are ``prompt_routed_experts``; the rest are the completion's. Where vLLM
  covers one position less (the last sampled token is never fed), ``routed_experts`` is None and
  the agent loop takes those positions from the next call's prompt routes
  (``Segment.record_context_routes``). Older vLLM, and dense models: both None. Newer vLLM
  returns routes only from its V2 model runner, which needs Triton: the engine turns it on
  (``VLLM_USE_V2_MODEL_RUNNER=1``) where vLLM asks for it, and where vLLM refuses even so (its
  CPU build) it runs without routes and warns (``returns_routes`` False).
- *Weights in flight.* ``load_weights(state_dict, version)`` may come from any thread (a
  ``WeightStore`` ``Subscriber.load_into(engine)``, the trainer's publish). With nothing
  generating the weights go in at once; while ``generate`` runs they are staged and copied in
  between two engine steps, so every token records the version whose weights sampled it
  (``Completion.token_versions``). The copy runs on every worker through ``LLM.collective_rpc``:
  vLLM's in-place reload (``reload_weights(weights_iterator=...)``, which undoes and redoes what
  vLLM did to the weights after loading, such as the CPU backend's kernel repacking) where the
  worker has it, else the model's ``load_weights``; either way vLLM's own loader, in place
  (parameter storage and CUDA graphs stay valid), from the checkpoint names ``checkpoint_names``
  rebuilds (transformers 5 fuses a MoE's experts into one tensor; vLLM loads them per expert).
  What vLLM allows, and what this relies on: weights may be replaced between steps while requests
  are running (the KV cache they wrote under the old weights is kept, as in ``LocalEngine`` and
  PipelineRL); the prefix cache cannot be reset while requests hold its blocks, so it is reset at
  the end of the call (and at once when nothing runs). Exact per-token versions need each ``step()``
  to be exactly one scheduler step: the engine core runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set unless the caller set it) and without async scheduling.
  With tensor parallelism the workers are processes and each update crosses to them pickled (CPU
  tensors): fine for small models, slow for 30B ones, where the workers should read the
  ``WeightStore`` themselves (docs/gpu.md, what remains).

- *One thread.* Every call into vLLM (building the ``LLM``, adding requests, stepping, the
  weight copies, the prefix-cache reset, shutting down) runs on one thread the engine owns,
  whichever thread calls ``generate`` or ``load_weights``: vLLM's in-process engine is not made
  for several threads, and its CPU build binds its OpenMP threads to the thread that built it
  (a step from another thread fails its attention kernel's thread-count check). Rollout workers
  and a trainer's publish may call from anywhere.

**HttpEngine** samples from a server's ``/v1/completions`` with token ids as the prompt and vLLM's
extensions (``return_tokens_as_token_ids``, ``stop_token_ids``; ``top_k`` (0: off, which vLLM >= 0.8
accepts), ``min_p``, and the penalties always sent, so the checkpoint's generation config fills none
of them) so the tokens come back as ids, with the logprob of each sampled token. Those logprobs are
of whatever distribution the server was started with (``vllm serve --logprobs-mode``; by default the
raw softmax, not the project's), the server takes no weights from the trainer, and it returns no
routes: the factory refuses it for RL and evaluation, and ``load_weights`` raises.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from opencomposer.types import Completion, SamplingParams

INSTALL_HINT = (
    'inference.backend = "vllm" needs vLLM, which is not installed in this environment. vLLM brings its '
    "own CUDA build of torch, so install it in a separate virtual environment, not in the CPU one "
    "`make setup` builds: `make gpu-setup` (or: python -m venv .venv-gpu && .venv-gpu/bin/pip install -e "
    "'.[gpu,dev]'), then run with .venv-gpu/bin/opencomposer; see docs/gpu.md."
)


class VLLMUnavailable(ImportError):
    """vLLM was asked for and is not installed; the message says how to install it."""


class EngineError(RuntimeError):
    """vLLM or a server returned something the ``Engine`` contract cannot carry."""


def import_vllm() -> Any:
    """The ``vllm`` module, or ``VLLMUnavailable`` with the install command."""
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailable(f"{INSTALL_HINT} ({e})") from e
    return vllm


def _row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """``LocalEngine``'s row seed (same numbers, without importing torch here)."""
    return int(np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(1)[0])


def _row_seeds(prompts: Sequence[Sequence[int]], params: SamplingParams, n: int,
               row_seeds: Sequence[int] | None, rng: np.random.Generator) -> list[int]:
    """One seed per (prompt, sample) row, prompt-major: the caller's, else from ``params.seed``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if row_seeds is not None:
        if len(row_seeds) != len(prompts) * n:
            raise ValueError(f"row_seeds: expected {len(prompts) * n} seeds, got {len(row_seeds)}")
        return [int(s) for s in row_seeds]
    seed = params.seed if params.seed is not None else int(rng.integers(2**62))
    return [_row_seed(seed, i, j) for i in range(len(prompts)) for j in range(n)]


def _reason(error: BaseException) -> str:
    """The line of an error's message that says why: vLLM's config errors are pydantic's, several
    lines with the reason after "Value error, "."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Value error, "):
            return line.removeprefix("Value error, ")
    return lines[0] if lines else type(error).__name__


def _refresh_vllm_environment() -> None:
    """Make vLLM read its environment variables again: a running engine core caches them for the
    process (``vllm.envs.enable_envs_cache``), so a variable set for the next engine would be missed."""
    try:
        from vllm import envs
    except ImportError:  # a stand-in, or a vLLM without that module
        return
    disable = getattr(envs, "disable_envs_cache", None)
    if disable is not None:
        disable()


def _check_prompts(prompts: Sequence[Sequence[int]], max_positions: int) -> list[list[int]]:
    out = [list(map(int, p)) for p in prompts]
    for i, prompt in enumerate(out):
        if not prompt:
            raise ValueError(f"prompt {i} is empty")
        if len(prompt) >= max_positions:
            raise ValueError(f"prompt {i} has {len(prompt)} tokens, the model's limit is {max_positions}")
    return out


# ----------------------------------------------------------------------------------------------
# Weight names


def checkpoint_names(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` (the trainer's transformers model) under the names of its saved checkpoint,
    the names vLLM's ``load_weights`` maps onto its own parameters.

    transformers 5 keeps a MoE layer's experts fused: ``...experts.gate_up_proj`` ``[E, 2I, H]``
    (gate rows first, then up) and ``...experts.down_proj`` ``[E, H, I]``; its checkpoints (and
    vLLM) have one ``...experts.{e}.gate_proj.weight`` ``[I, H]``, ``up_proj.weight`` and
    ``down_proj.weight`` ``[H, I]`` per expert. Those two are split (views, no copy); the
    project's MTP layers (``mtp.*``, which vLLM does not run) are left out; every other tensor keeps
    its name. ``tests/inference/test_vllm_engine.py`` checks the result against what
    ``save_checkpoint`` writes."""
    out: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        if name.startswith("mtp."):  # the project's MTP layers (model.mtp): vLLM does not run them
            continue
        if name.endswith(".experts.gate_up_proj") and tensor.dim() == 3:
            prefix = name[: -len("gate_up_proj")]
            half = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = tensor[e, :half]
                out[f"{prefix}{e}.up_proj.weight"] = tensor[e, half:]
        elif name.endswith(".experts.down_proj") and tensor.dim() == 3:
            prefix = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = tensor[e]
        else:
            out[name] = tensor
    return out


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Runs on every vLLM worker (``LLM.collective_rpc``): vLLM's loader copies each named tensor
    into its (possibly sharded, stacked) parameter in place. Returns the tensors handed over.

    Where the worker has ``reload_weights(weights_iterator=...)`` (vLLM's in-place reload), that is
    used: it puts back the layout the model had before vLLM processed its weights after loading
    (kernel repacking, as vLLM's CPU backend does to every linear layer), loads the checkpoint-format
    tensors and processes them again. Older vLLM has no such method; there the model's own
    ``load_weights`` copies into the parameters as they are."""
    runner_reload = getattr(worker.model_runner, "reload_weights", None)  # the worker's takes *args, **kwargs
    parameters = inspect.signature(runner_reload).parameters if runner_reload is not None else {}
    if "weights_iterator" in parameters:
        extra = {"is_checkpoint_format": True} if "is_checkpoint_format" in parameters else {}
        worker.reload_weights(weights_iterator=iter(weights), **extra)
    else:
        worker.model_runner.model.load_weights(weights=iter(weights))
    return len(weights)


# ----------------------------------------------------------------------------------------------
# VLLMEngine


class _Row:
    __slots__ = ("prompt_index", "sample_index", "tokens", "logprobs", "versions", "finish", "routes")

    def __init__(self, prompt_index: int, sample_index: int):
        self.prompt_index, self.sample_index = prompt_index, sample_index
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.finish: str | None = None
        self.routes: Any = None


def sampled_logprobs(logprobs: Any, tokens: Sequence[int]) -> list[float]:
    """The logprob of each sampled token from vLLM's per-position logprobs (a sequence of
    ``{token_id: Logprob}``, the sampled token always among them)."""
    if logprobs is None or len(logprobs) != len(tokens):
        got = None if logprobs is None else len(logprobs)
        raise EngineError(f"vLLM returned {got} logprob positions for {len(tokens)} tokens "
                          "(every request asks for logprobs=0, the sampled token's)")
    out = []
    for position, token in zip(logprobs, tokens):
        entry = position.get(token) if position is not None else None
        if entry is None:
            raise EngineError(f"vLLM returned no logprob for the sampled token {token}")
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def split_routes(routes: Any, prompt_length: int, tokens: int, dtype: np.dtype) -> tuple[Any, Any]:
    """``(prompt_routed_experts, routed_experts)`` from vLLM's routes of the whole sequence (see
    module doc): ``None, None`` when it returned none; the completion's part None when vLLM
    covers one position less than prompt + completion."""
    if routes is None:
        return None, None
    array = np.asarray(routes)
    if array.ndim != 3:
        raise EngineError(f"vLLM routed_experts: expected [positions, moe_layers, top_k], got shape {array.shape}")
    array = array.astype(dtype, copy=False)
    if len(array) == prompt_length + tokens:
        return array[:prompt_length], array[prompt_length:]
    if len(array) == prompt_length + tokens - 1:
        return array[:prompt_length], None
    raise EngineError(f"vLLM routed_experts covers {len(array)} positions; the request has {prompt_length} prompt "
                      f"and {tokens} sampled tokens")


class VLLMEngine:
    """``Engine`` over vLLM's offline ``LLM`` (see module doc). Build it with ``from_model`` (a
    live transformers model, saved once to a folder vLLM loads) or from a checkpoint folder."""

    def __init__(self, model_path: str | Path, tokenizer: Any, config: Any, *, policy_version: int = 0,
                 eos_ids: Iterable[int] = (), is_moe: bool = False, num_experts: int = 0,
                 max_positions: int = 0, llm: Any = None):
        """``config``: the recipe's ``InferenceConfig``. ``llm``: an ``LLM`` already built (tests);
        None builds one from ``model_path``."""
        self.vllm = import_vllm()
        self.tokenizer = tokenizer
        self.config = config
        self.policy_version = policy_version
        self.eos_ids = set(int(i) for i in eos_ids)
        self.is_moe = is_moe
        self.route_dtype = np.dtype(np.uint8) if num_experts <= 256 else np.dtype(np.uint16)
        self.max_positions = config.max_model_len or max_positions or 1 << 30
        self.model_path = Path(model_path)
        self.returns_routes = False
        # every call into vLLM runs on this one thread (module doc, "One thread")
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self._thread_id = self._thread.submit(threading.get_ident).result()
        self.llm = llm if llm is not None else self._on_engine_thread(self._build_llm)
        self._seed_rng = np.random.default_rng()
        self._ids = 0
        self.prompt_tokens = 0  # prompt tokens of every request so far ...
        self.cached_prompt_tokens = 0  # ... and those vLLM's prefix cache served (RequestOutput.num_cached_tokens)
        self._generate_lock = threading.Lock()  # vLLM's engine is driven by one thread at a time
        self._weights_lock = threading.Lock()  # guards _staged, _generating and every copy into the workers
        self._staged: tuple[dict[str, Any], int] | None = None
        self._generating = False
        self._prefix_cache_stale = False

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, config: Any, *, policy_version: int = 0,
                   folder: str | Path | None = None) -> VLLMEngine:
        """Save ``model`` (a transformers causal LM) and ``tokenizer`` to ``folder`` (a new
        temporary folder when None) and start vLLM on it; the weights vLLM serves are then the
        model's as of this call."""
        import_vllm()  # fail before writing a checkpoint
        from opencomposer.model.loading import save_checkpoint
        from opencomposer.model.routing import RouteRecorder, num_experts
        from opencomposer.model.tokenizer import stop_token_ids

        folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="opencomposer-vllm-"))
        save_checkpoint(model, tokenizer, folder)
        config_eos = model.generation_config.eos_token_id
        config_eos = [config_eos] if isinstance(config_eos, int) else list(config_eos or [])
        return cls(folder, tokenizer, config, policy_version=policy_version,
                   eos_ids=set(stop_token_ids(tokenizer)) | set(config_eos),
                   is_moe=bool(RouteRecorder(model).routers), num_experts=num_experts(model),
                   max_positions=int(getattr(model.config, "max_position_embeddings", 0) or 0))

    def _build_llm(self) -> Any:
        """``vllm.LLM`` with the recipe's knobs and what this adapter relies on (module doc)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one step() = one scheduler step
        known = set(getattr(self.vllm.EngineArgs, "__dataclass_fields__", {}))
        kwargs: dict[str, Any] = dict(
            model=str(self.model_path), tokenizer=str(self.model_path), dtype=self.config.dtype,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            tensor_parallel_size=self.config.tensor_parallel_size,
            enable_prefix_caching=self.config.enable_prefix_caching,
            logprobs_mode="processed_logprobs", generation_config="vllm", seed=0,
        )
        if self.config.max_model_len:
            kwargs["max_model_len"] = self.config.max_model_len
        if self.config.enforce_eager:
            kwargs["enforce_eager"] = True
        if "async_scheduling" in known:
            kwargs["async_scheduling"] = False
        if "logprobs_mode" not in known:
            raise EngineError("this vLLM has no logprobs_mode, so its logprobs would be the raw softmax, not those of "
                              "the distribution sampled from; install vllm>=0.11 (the gpu extra pins it)")
        if self.is_moe and "enable_return_routed_experts" in known:
            if not self.config.enable_prefix_caching:
                warnings.warn("inference.enable_prefix_caching = false: vLLM returns routed experts only with its "
                              "prefix cache on, so this engine runs without them", stacklevel=3)
            elif (llm := self._build_llm_with_routes(kwargs)) is not None:
                return llm
        return self.vllm.LLM(**kwargs)

    def _build_llm_with_routes(self, kwargs: dict[str, Any]) -> Any:
        """``vllm.LLM`` returning the routed experts, or None where this vLLM build cannot.

        Newer vLLM returns routes only from its V2 model runner (``VLLM_USE_V2_MODEL_RUNNER=1``),
        which needs Triton: where the first try says so and the caller left that variable unset,
        it is set, for the whole process (later engines, dense ones too, run on the V2 runner),
        and tried again. Where vLLM still refuses (its CPU build has no Triton), the variable goes
        back as it was and the engine runs without routes, saying so: router replay then has no
        sampler routes for these completions (``returns_routes`` False)."""
        kwargs = dict(kwargs, enable_return_routed_experts=True)
        variable = "VLLM_USE_V2_MODEL_RUNNER"
        try:
            llm = self.vllm.LLM(**kwargs)
        except ValueError as e:  # vLLM's config validation (pydantic's ValidationError is one)
            if "Model Runner V2" not in str(e) or variable in os.environ:
                raise
            os.environ[variable] = "1"  # for the process: vLLM reads it again for every engine
            _refresh_vllm_environment()
            try:
                llm = self.vllm.LLM(**kwargs)
            except BaseException as again:
                del os.environ[variable]
                _refresh_vllm_environment()
                if not isinstance(again, ValueError):
                    raise
                warnings.warn(f"this vLLM build returns no routed experts ({_reason(again)}); the engine runs "
                              "without them and router replay gets no sampler routes", stacklevel=3)
                return None
        self.returns_routes = True
        return llm

    def _on_engine_thread(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the engine's thread (at once when already on it)."""
        if threading.get_ident() == self._thread_id:
            return fn(*args, **kwargs)
        return self._thread.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """Shut vLLM down and free what it holds in this process (its engine core, the process
        groups it set up, the GPU memory of its weights and KV cache), so that another engine can
        start here: vLLM keeps one model-parallel state per process, and a second ``LLM`` beside
        a live one finds it already set. The inference service calls it on a dead engine before
        it builds the next one. Later calls do nothing; ``generate`` on a closed engine raises and
        ``load_weights`` does nothing (a rebuilt engine starts from the newest published weights).
        Not from inside a running ``generate`` (it waits for that call to end)."""
        with self._generate_lock:
            with self._weights_lock:
                llm, self.llm = self.llm, None
                self._staged = None
            if llm is None:
                return
            try:
                self._on_engine_thread(self._shut_down, llm)
            finally:
                del llm
                self._thread.shutdown(wait=threading.get_ident() != self._thread_id)

    @staticmethod
    def _shut_down(llm: Any) -> None:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm, core
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        except ImportError:  # an older vLLM (or a stand-in): nothing more to release
            return
        cleanup_dist_env_and_memory()

    # ------------------------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Take ``state_dict`` (the trainer's names) as policy ``version``; any thread. Applied at
        once with nothing generating, else staged (a copy) and applied between two engine steps."""
        with self._weights_lock:
            if self.llm is None:  # closed
                return
            if self._generating:
                self._staged = ({k: v.detach().clone() for k, v in state_dict.items()}, version)
            else:
                self._staged = None
                self._copy_in(state_dict, version)

    def _copy_in(self, state_dict: dict[str, Any], version: int) -> None:
        """Hand the weights to every worker's loader (the caller holds the weights lock)."""
        weights = checkpoint_names(state_dict)
        if self.config.tensor_parallel_size > 1:  # they cross to worker processes pickled
            weights = {k: v.detach().cpu() for k, v in weights.items()}
        self._on_engine_thread(self.llm.collective_rpc, _load_weights_on_worker, args=(list(weights.items()),))
        self.policy_version = version
        self._prefix_cache_stale = True
        if not self._generating:
            self._reset_prefix_cache()

    def _reset_prefix_cache(self) -> None:
        """Drop the KV blocks computed by replaced weights (possible only with no request running)."""
        if self._prefix_cache_stale and self.config.enable_prefix_caching:
            if self._on_engine_thread(self.llm.reset_prefix_cache) is False:
                return
        self._prefix_cache_stale = False

    def _apply_staged(self) -> None:
        if self._staged is None:
            return
        with self._weights_lock:
            if self._staged is not None:
                self._copy_in(*self._staged)
                self._staged = None

    # ------------------------------------------------------------------------------------------
    def sampling_params(self, params: SamplingParams, seed: int) -> Any:
        """The ``vllm.SamplingParams`` of one row: n = 1, its seed, the sampled token's processed
        logprob, ids out as deltas per step."""
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        return self.vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k, min_p=0.0, seed=int(seed), stop=list(params.stop) or None,
            stop_token_ids=sorted(stop_ids), ignore_eos=params.ignore_eos, include_stop_str_in_output=True,
            logprobs=0, skip_special_tokens=False, detokenize=bool(params.stop),
            output_kind=self.vllm.sampling_params.RequestOutputKind.DELTA,
        )

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1,
                 row_seeds: Sequence[int] | None = None) -> list[Completion]:
        """``n`` samples of each prompt, prompt-major (the ``Engine`` contract; ``row_seeds`` as
        ``LocalEngine``'s)."""
        if params.speculative != "off":
            raise ValueError(f'sampling.speculative = "{params.speculative}" drafts with the project\'s MTP layers in '
                             'LocalEngine; vLLM has its own speculative decoding (its speculative_config), not wired here')
        if self.llm is None:
            raise EngineError("this VLLMEngine was closed")
        prompts = _check_prompts(prompts, self.max_positions)
        seeds = _row_seeds(prompts, params, n, row_seeds, self._seed_rng)
        rows = [_Row(i, j) for i in range(len(prompts)) for j in range(n)]
        if params.max_new_tokens == 0:
            return [self._completion(row, prompts, self.policy_version) for row in rows]
        with self._generate_lock:
            if self.llm is None:  # closed while this call waited
                raise EngineError("this VLLMEngine was closed")
            with self._weights_lock:
                self._generating = True
            try:
                first_version = self._on_engine_thread(self._run, prompts, rows, seeds, params)
            finally:
                with self._weights_lock:
                    self._generating = False
                    if self._staged is not None:  # staged after the last step
                        self._copy_in(*self._staged)
                        self._staged = None
                    self._reset_prefix_cache()
        return [self._completion(row, prompts, first_version) for row in rows]

    def _run(self, prompts: list[list[int]], rows: list[_Row], seeds: list[int], params: SamplingParams) -> int:
        """Add every row as a request and step vLLM until all are done (on the engine's thread,
        while ``_generating``); weights staged meanwhile go in between two steps. Returns the
        version the first step ran at."""
        self._apply_staged()
        first_version = self.policy_version
        engine = self.llm.llm_engine
        by_id: dict[str, _Row] = {}
        for row, seed in zip(rows, seeds):
            self._ids += 1
            request_id = f"opencomposer-{self._ids}"
            by_id[request_id] = row
            engine.add_request(request_id, {"prompt_token_ids": prompts[row.prompt_index]},
                               self.sampling_params(params, seed))
            self.prompt_tokens += len(prompts[row.prompt_index])
        try:
            while engine.has_unfinished_requests():
                self._apply_staged()
                version = self.policy_version  # the weights of the step about to run
                for output in engine.step():
                    row = by_id.get(output.request_id)
                    if row is None:
                        continue
                    self._take(row, output, version)
        except BaseException:
            unfinished = [rid for rid, row in by_id.items() if row.finish is None]
            if unfinished:
                engine.abort_request(unfinished)
            raise
        return first_version

    def _take(self, row: _Row, output: Any, version: int) -> None:
        """Add one step's delta (``RequestOutputKind.DELTA``) of a request to its row."""
        completion = output.outputs[0]
        tokens = [int(t) for t in completion.token_ids]
        row.logprobs += sampled_logprobs(completion.logprobs, tokens)
        row.tokens += tokens
        row.versions += [version] * len(tokens)
        if output.finished:
            reason = completion.finish_reason
            if reason not in ("stop", "length"):
                raise EngineError(f"vLLM ended request {output.request_id} with finish_reason {reason!r}")
            row.finish = reason
            row.routes = getattr(completion, "routed_experts", None)
            self.cached_prompt_tokens += int(getattr(output, "num_cached_tokens", None) or 0)

    def _completion(self, row: _Row, prompts: list[list[int]], version: int) -> Completion:
        prompt_routes, routes = split_routes(row.routes, len(prompts[row.prompt_index]), len(row.tokens),
                                             self.route_dtype) if self.is_moe else (None, None)
        return Completion(
            token_ids=row.tokens, logprobs=row.logprobs, finish_reason=row.finish or "length",
            text=self.tokenizer.decode(row.tokens, skip_special_tokens=False) if self.tokenizer is not None else "",
            routed_experts=routes, prompt_routed_experts=prompt_routes,
            prompt_index=row.prompt_index, sample_index=row.sample_index,
            policy_version=version, token_versions=list(row.versions),
        )


# ----------------------------------------------------------------------------------------------
# HttpEngine


class HttpEngine:
    """``Engine`` over an OpenAI-compatible server's ``/completions`` with vLLM's token-id
    extensions (module doc). Sampling only: ``load_weights`` raises, routes are None, logprobs
    are the server's (its ``--logprobs-mode``)."""

    def __init__(self, base_url: str, model: str, tokenizer: Any = None, *, timeout_s: float = 600.0,
                 max_positions: int = 0, concurrency: int = 64):
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.max_positions = max_positions or 1 << 30
        self.concurrency = concurrency
        self.policy_version = 0
        self.model = model or self._first_model()
        self._seed_rng = np.random.default_rng()

    def _request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One JSON request (POST with a body, else GET); errors name the URL and the server's reply."""
        url = f"{self.base_url}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise EngineError(f"{url}: HTTP {e.code}: {e.read()[:500]!r}") from e
        except (urllib.error.URLError, OSError) as e:
            raise EngineError(f"{url}: {e}") from e

    def _first_model(self) -> str:
        models = self._request("/models").get("data") or []
        if not models:
            raise EngineError(f"{self.base_url}/models lists no model; set inference.http_model")
        return str(models[0]["id"])

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        raise EngineError('inference.backend = "http": a remote OpenAI-compatible server cannot take new weights '
                          'from the trainer; use inference.backend = "vllm" or "local" for RL')

    def body(self, prompt: list[int], params: SamplingParams, seed: int) -> dict[str, Any]:
        """The ``/completions`` request of one row."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "n": 1, "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "seed": int(seed) % (1 << 63),
            "logprobs": 0, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
            "include_stop_str_in_output": True, "ignore_eos": params.ignore_eos,
            # vLLM's extensions, always sent: left out, the server fills them from the checkpoint's
            # generation_config.json, and the tokens would come from another distribution than the
            # one the trainer scores
            "top_k": params.top_k, "min_p": 0.0, "repetition_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        return body

    @staticmethod
    def parse(choice: dict[str, Any]) -> tuple[list[int], list[float], str]:
        """Token ids, their logprobs and the finish reason of one choice; refuses a reply without
        token-level logprobs or without ids (a server that lacks vLLM's extensions)."""
        logprobs = choice.get("logprobs") or {}
        tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
        if tokens is None or values is None:
            raise EngineError("the server returned no token-level logprobs (logprobs.tokens / token_logprobs); "
                              "the http backend needs vLLM's OpenAI server or one with the same extensions")
        ids = []
        for token in tokens:
            if not (isinstance(token, str) and token.startswith("token_id:")):
                raise EngineError(f"the server returned token {token!r}, not an id: it ignores "
                                  "return_tokens_as_token_ids (a vLLM extension)")
            ids.append(int(token.removeprefix("token_id:")))
        reason = choice.get("finish_reason") or "length"
        if reason not in ("stop", "length"):
            raise EngineError(f"the server ended a completion with finish_reason {reason!r}")
        return ids, [float(v) for v in values], reason

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1,
                 row_seeds: Sequence[int] | None = None) -> list[Completion]:
        prompts = _check_prompts(prompts, self.max_positions)
        seeds = _row_seeds(prompts, params, n, row_seeds, self._seed_rng)
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        if params.max_new_tokens == 0:
            return [Completion([], [], "length", prompt_index=i, sample_index=j) for i, j in rows]

        def one(k: int) -> Completion:
            i, j = rows[k]
            reply = self._request("/completions", self.body(prompts[i], params, seeds[k]))
            ids, logprobs, reason = self.parse(reply["choices"][0])
            text = self.tokenizer.decode(ids, skip_special_tokens=False) if self.tokenizer is not None \
                else reply["choices"][0].get("text", "")
            return Completion(ids, logprobs, reason, text=text, prompt_index=i, sample_index=j,
                              policy_version=self.policy_version)

        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(rows)))) as pool:
            return list(pool.map(one, range(len(rows))))
