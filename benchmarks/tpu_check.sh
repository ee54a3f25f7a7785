#!/usr/bin/env bash
# One prepared TPU session (a TPU VM with network): the TPU kernel's tests compiled (on a TPU
# the backend suite runs impl="pallas_tpu" un-interpreted), then the TPU rows of the attention
# benchmark. Logs and JSON go to $OUT (or benchmarks/results/); attention.py writes its JSON
# after every row, so a timeout keeps what it measured. Nothing here has been run yet: no TPU
# was available when it was written (docs/kernels_tpu.md).
#   TPU VM:  bash benchmarks/tpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=python3
$py -m pip install -q -e ".[dev,tpu]" || exit 1
$py -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tee "$out/tpu_env.txt"

timeout 600 $py -m pytest -q -p no:cacheprovider tests/kernels/test_pallas_tpu.py \
  tests/kernels/test_forgetting_attention.py -k "tpu" 2>&1 | tail -40 > "$out/tpu_tests.log"
tail -3 "$out/tpu_tests.log"
timeout 600 $py benchmarks/attention.py --seq-lens 16384 \
  --impls pallas_tpu pallas_tpu_flash_nobias xla dot_product_attention_bias \
  --out "$out/attention_tpu_16k.json"
timeout 600 $py benchmarks/attention.py --seq-lens 1024 2048 4096 8192 32768 \
  --impls pallas_tpu pallas_tpu_flash_nobias xla --out "$out/attention_tpu.json"
