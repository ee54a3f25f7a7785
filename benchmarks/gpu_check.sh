#!/usr/bin/env bash
# One prepared GPU session: the kernel tests un-interpreted, then the benchmarks; JSON under $OUT
# (or benchmarks/results/). Usage on a GPU machine, from the repo root:
#   bash benchmarks/gpu_check.sh            # needs jax with CUDA, flax, optax, pytest, hypothesis
set -uo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -c "import jax; print(jax.devices())"
python -c "import lpcjax.kernels" || { echo "install first: pip install -e ." >&2; exit 1; }
timeout 240 python -m pytest -q -x tests/kernels 2>&1 | tee "$out/gpu_tests.log"
timeout 300 python benchmarks/attention.py --out "$out/attention_gpu.json" 2>&1 | tee "$out/attention_gpu.log"
python benchmarks/attention_memory.py --dtype bfloat16 --seq-lens 4096 8192 16384 32768 \
  --impls xla --out "$out/attention_memory_gpu.json" 2>&1 | tail -6
