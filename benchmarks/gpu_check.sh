#!/usr/bin/env bash
# One prepared GPU session, at most about 9.5 minutes (its timeouts): the kernel tests
# compiled (not interpreted), then the benchmarks, the issue's targets first. Logs and JSON go
# to $OUT (or benchmarks/results/). attention.py writes its JSON after every row, so a timeout
# keeps what it measured; train_step.py writes once, at its end.
#   here, once:  bash benchmarks/gpu_wheels.sh     # packages the device lacks -> .whl/
#   device:      bash benchmarks/gpu_check.sh      # (carry .whl)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=python3
if compgen -G ".whl/*.whl" > /dev/null; then  # no network there: install what was carried
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
$py -m pip install -q --no-deps --no-build-isolation -e . || exit 1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $py -c "import jax; print('jax', jax.__version__, jax.devices())"; } 2>&1 | tee "$out/gpu_env.txt"

# (test_triton_kernels.py runs the Triton kernels interpreted on the CPU: skipped here, where the
# shared suite runs impl="triton" compiled)
timeout 150 $py -m pytest -q -p no:cacheprovider tests/kernels \
  --ignore tests/kernels/test_triton_kernels.py 2>&1 | tail -40 > "$out/gpu_tests.log"
tail -3 "$out/gpu_tests.log"
timeout 150 $py benchmarks/attention.py --seq-lens 16384 \
  --impls triton pallas pallas_mha_nobias xla dot_product_attention_bias \
  --out "$out/attention_gpu_16k.json"
timeout 120 $py benchmarks/attention.py --seq-lens 1024 2048 4096 8192 32768 \
  --impls triton pallas pallas_mha_nobias xla reference --out "$out/attention_gpu.json"
timeout 120 $py benchmarks/train_step.py --config paper:fox_pro_125m \
  --set data.seq_len=4096 data.batch_size=8 --families fox transformer --steps 5 --rounds 2 \
  --peak-tflops 989 --out "$out/train_step_gpu.json"
