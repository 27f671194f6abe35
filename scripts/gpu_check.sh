#!/usr/bin/env bash
# GPU check for inference.backend = "vllm" (docs/gpu.md), on one NVIDIA GPU, in under 10 minutes:
#
#   1. builds (or reuses) a separate venv with the gpu extra: vLLM brings the CUDA torch it is built
#      against, which the CPU venv of `make setup` (torch 2.13.0 CPU wheel, pinned by the Makefile)
#      must not get and must not block;
#   2. runs the gpu-marked tests (tests/inference/test_vllm_engine.py: vLLM's processed logprobs
#      against the trainer's scoring, seeds per row, in-flight weight updates, MoE routes);
#   3. measures sampler tokens/s (VLLMEngine against LocalEngine on the same GPU) and trainer
#      tokens/s (one RL train_step) on SmolLM2-135M, and prints one table.
#
# Usage: scripts/gpu_check.sh            (GPU_VENV=.venv-gpu by default; SKIP_INSTALL=1 reuses it as is)
# Needs: Linux, an NVIDIA driver, network access for the first install, and SmolLM2 in the cache
# (`opencomposer models fetch smollm2`, which the script runs).
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_VENV=${GPU_VENV:-.venv-gpu}
PY=$GPU_VENV/bin/python
start=$(date +%s)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi); nothing to check here" >&2
  exit 2
fi
nvidia-smi -L | head -1

if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  test -x "$PY" || python3 -m venv "$GPU_VENV"
  "$GPU_VENV/bin/pip" install -q --upgrade pip
  "$GPU_VENV/bin/pip" install -q -e ".[gpu]"
fi
"$PY" - <<'EOF'
import torch, vllm
assert torch.cuda.is_available(), "the gpu venv's torch sees no CUDA device"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}, {torch.cuda.get_device_name()}")
EOF
"$GPU_VENV/bin/opencomposer" models fetch smollm2 >/dev/null

echo "== gpu-marked tests"
"$PY" -m pytest -q -m gpu tests/inference/test_vllm_engine.py -p no:cacheprovider --timeout 300

echo "== throughput (SmolLM2-135M, bfloat16, one GPU)"
"$PY" - <<'EOF'
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from opencomposer.config import InferenceConfig, ModelConfig
from opencomposer.model.loading import load_model
from opencomposer.types import SamplingParams

PROMPTS, N, NEW_TOKENS = 32, 8, 256  # 256 rows of 256 tokens, the shape of a few RL groups
rows = []


def sampler(name, engine, prompts):
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, top_p=1.0, seed=0, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=8, seed=0), n=2)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = engine.generate(prompts, params, n=N)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for c in out)
    rows.append((f"sampler: {name}", f"{PROMPTS} prompts x n={N} x {NEW_TOKENS} tokens", tokens / seconds, seconds))


model, tokenizer = load_model(ModelConfig(kind="smollm2", dtype="bfloat16"), device="cuda")
rng = np.random.default_rng(0)
system = tokenizer.encode("You are a coding agent. Tools: read_file, write_file, run, finish.\n" * 8)
prompts = [system + rng.integers(100, 40000, 64).tolist() for _ in range(PROMPTS)]

try:
    from opencomposer.inference.local import LocalEngine

    sampler("LocalEngine (batch-invariant)", LocalEngine(model, tokenizer, max_batch_size=PROMPTS * N), prompts)
except Exception as e:  # noqa: BLE001 - reported in the table
    rows.append(("sampler: LocalEngine", f"failed: {e}", float("nan"), float("nan")))
try:
    from opencomposer.inference.vllm import VLLMEngine

    engine = VLLMEngine.from_model(model, tokenizer, InferenceConfig(
        backend="vllm", gpu_memory_utilization=0.35, max_model_len=2048, dtype="bfloat16"))
    sampler("VLLMEngine", engine, prompts)
    start = time.perf_counter()
    engine.load_weights(model.state_dict(), 1)
    rows.append(("vLLM weight update", "full state dict, in place", float("nan"), time.perf_counter() - start))
except Exception as e:  # noqa: BLE001
    rows.append(("sampler: VLLMEngine", f"failed: {e}", float("nan"), float("nan")))

try:  # the trainer: one RL step (forward, loss, backward, Adam) on B x G rows, benchmarks/trainer.py's `ours`
    sys.path.insert(0, str(Path("benchmarks").resolve()))
    import types

    import trainer as bench_trainer

    train_model, _ = load_model(ModelConfig(kind="smollm2", dtype="float32"), device="cuda")
    args = types.SimpleNamespace(prompts=4, group=8, prefix=512, instruction=64, completion=256,
                                 micro_batch_tokens=16384, steps=3)
    batch = bench_trainer.synthetic_batch(args)
    seconds = bench_trainer.ours(train_model, tokenizer, batch, args, share_prefix=True)
    tokens = args.prompts * args.group * (args.prefix + args.instruction + args.completion)
    rows.append(("trainer: train_step", f"{args.prompts}x{args.group} rows x {tokens // (args.prompts * args.group)} "
                 "tokens, fp32", tokens / seconds, seconds))
except Exception as e:  # noqa: BLE001
    rows.append(("trainer: train_step", f"failed: {e}", float("nan"), float("nan")))

print(f"\n{'what':<34} {'shape':<44} {'tokens/s':>12} {'seconds':>9}")
for what, shape, rate, seconds in rows:
    print(f"{what:<34} {shape[:44]:<44} {rate:>12,.0f} {seconds:>9.2f}")
EOF
echo "gpu_check: done in $(( $(date +%s) - start )) s"
