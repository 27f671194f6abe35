#!/usr/bin/env bash
# GPU check for inference.backend = "vllm" (docs/gpu.md), on one NVIDIA GPU, in under 10 minutes:
#
#   1. builds (or reuses) a separate venv with the gpu extra: vLLM brings the CUDA torch it is built
#      against, which the CPU venv of `make setup` (torch 2.13.0 CPU wheel, pinned by the Makefile)
#      must not get and must not block;
#   2. runs the gpu-marked tests (tests/inference/test_vllm_engine.py: vLLM's processed logprobs
#      against the trainer's scoring, seeds per row, weights switched between two steps of a
#      running call, the prefix cache serving a group's prompt, a MoE's routes and expert weights);
#   3. measures sampler tokens/s (VLLMEngine against LocalEngine on the same GPU) and trainer
#      tokens/s (one RL train_step) on SmolLM2-135M, and prints one table (benchmarks/vllm_engine.py).
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
"$PY" -m pytest -q -rxs -m gpu tests/inference/test_vllm_engine.py -p no:cacheprovider --timeout 300

echo "== throughput (SmolLM2-135M, bfloat16, one GPU)"
"$PY" benchmarks/vllm_engine.py --device cuda --trainer
echo "gpu_check: done in $(( $(date +%s) - start )) s"
