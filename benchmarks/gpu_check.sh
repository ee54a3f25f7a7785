#!/usr/bin/env bash
# One prepared GPU session: the kernel tests un-interpreted, then the benchmarks; JSON under $OUT
# (or benchmarks/results/). Usage on a GPU machine, from the repo root:
#   bash benchmarks/gpu_check.sh            # needs jax with CUDA, flax, optax, pytest, hypothesis
set -uo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python -c "import jax; print(jax.devices())"
# `lpcjax.kernels` comes from ./kernels through the package mapping; without an install, alias it.
python - <<'PY'
import importlib, sys
try:
  import lpcjax.kernels  # installed
except ImportError:
  print("lpcjax is not installed: pip install -e . first", file=sys.stderr); sys.exit(1)
PY
timeout 240 python -m pytest -q -x tests/kernels 2>&1 | tee "$out/gpu_tests.log"
timeout 300 python benchmarks/attention.py --out "$out/attention_gpu.json" 2>&1 | tee "$out/attention_gpu.log"
python benchmarks/attention_memory.py --dtype bfloat16 --seq-lens 4096 8192 16384 32768 \
  --impls xla --out "$out/attention_memory_gpu.json" 2>&1 | tail -6
