#!/usr/bin/env bash
# One prepared GPU session, at most about 9.5 minutes (its timeouts): the kernel tests
# compiled (not interpreted), then the benchmarks, the issue's targets first. Logs and JSON go
# to $OUT (or benchmarks/results/). attention.py writes its JSON after every row, so a timeout
# keeps what it measured; train_step.py writes once, at its end.
#   here, once:  bash benchmarks/gpu_wheels.sh     # packages the device lacks -> .whl/
#   device:      bash benchmarks/gpu_check.sh      # (carry .whl)
. "$(dirname "$0")/gpu_setup.sh"

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
