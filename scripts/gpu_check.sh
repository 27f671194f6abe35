#!/usr/bin/env bash
# GPU check (docs/gpu.md), on one NVIDIA GPU, in under 10 minutes:
#
#   1. builds (or reuses) a separate venv with the gpu extra: vLLM brings the CUDA torch it is built
#      against, which the CPU venv of `make setup` (torch 2.13.0 CPU wheel, pinned by the Makefile)
#      must not get and must not block;
#   2. runs the gpu-marked tests: tests/inference/test_vllm_engine.py (vLLM's processed logprobs
#      against the trainer's scoring, seeds per row, weights switched between two steps of a
#      running call, the prefix cache serving a group's prompt, a MoE's routes and expert weights)
#      and tests/gpu (the quantisers' bits, pretraining and an RL train_step on the GPU against the
#      CPU in float32 and bf16, an RL run on the GPU; on two GPUs or more, RL over NCCL against one);
#   3. measures sampler tokens/s (VLLMEngine against LocalEngine on the same GPU) and trainer
#      tokens/s (one RL train_step) on SmolLM2-135M, and prints one table (benchmarks/vllm_engine.py).
#
# Usage: scripts/gpu_check.sh            (GPU_VENV=.venv-gpu by default; SKIP_INSTALL=1 reuses it as is)
#        GPU_PYTHON=python3 scripts/gpu_check.sh
#                                        (an interpreter that already has a CUDA torch, as in a PyTorch
#                                        container: nothing is installed, the package runs from src/
#                                        through PYTHONPATH; without vLLM there its tests skip and the
#                                        table is left out, so what runs is tests/gpu)
# Needs: Linux, an NVIDIA driver, network access for the first install, and SmolLM2 in the cache
# (`opencomposer models fetch smollm2`, which the script runs; offline, the table is left out).
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

if [ -n "${GPU_PYTHON:-}" ]; then
  PY=$GPU_PYTHON
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
elif [ "${SKIP_INSTALL:-0}" != "1" ]; then
  test -x "$PY" || python3 -m venv "$GPU_VENV"
  "$GPU_VENV/bin/pip" install -q --upgrade pip
  "$GPU_VENV/bin/pip" install -q -e ".[gpu]"
fi
has_vllm=$("$PY" - <<'EOF'
import importlib.util, sys, torch
assert torch.cuda.is_available(), f"this Python's torch ({torch.__version__}) sees no CUDA device"
found = importlib.util.find_spec("vllm") is not None
version = __import__("vllm").__version__ if found else "not installed (its tests skip)"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {version}, "
      f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}", file=sys.stderr)
print(int(found))
EOF
)
has_vllm=${has_vllm##*$'\n'}  # the last line: vLLM may log to stdout on import
has_model=1
"$PY" -m opencomposer.cli models fetch smollm2 >/dev/null 2>/tmp/gpu_check_fetch.log || {
  has_model=0; echo "SmolLM2 not fetched ($(tail -1 /tmp/gpu_check_fetch.log)): the throughput table is left out"; }

echo "== gpu-marked tests"
"$PY" -m pytest -q -rxs -m gpu tests/gpu tests/inference/test_vllm_engine.py -p no:cacheprovider --timeout 900

if [ "$has_vllm" = "1" ] && [ "$has_model" = "1" ]; then
  echo "== throughput (SmolLM2-135M, bfloat16, one GPU)"
  "$PY" benchmarks/vllm_engine.py --device cuda --trainer
else
  echo "== throughput: left out (vLLM installed: $has_vllm; SmolLM2 fetched: $has_model)"
fi
echo "gpu_check: done in $(( $(date +%s) - start )) s"
