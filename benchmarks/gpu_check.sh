#!/usr/bin/env bash
# One prepared GPU session, at most BUDGET seconds (default 530): what a user choosing a FoX kernel
# asks, most important first, each step bounded by its own timeout and by what is left, its
# JSON written row by row:
#   1. check       the kernels compiled (pallas, triton, mosaic_gpu: versions 2 and 1, the
#                  one-kernel backward mosaic_gpu_fused and the hardware-only path
#                  mosaic_gpu_hw) against float64 at T up to
#                  16k, pruning included (kernel_check.py)
#   2. attn16k     forgetting attention fwd / fwd+bwd at T = 16k, D = 128: lpcjax's backends, the
#                  cuDNN floor, JAX's Pallas flash attention without the gate (attention.py)
#   3. peers16k    the same row for fla, the official FoX kernel and PyTorch SDPA (attention_peers.py)
#   4. pruning     prune_epsilon on gates of timescale 32 and 2048 at T = 16k, and the official ACP
#   5. sweep       T = 2k, 8k, 32k at D = 64 and 128 (and 16k at 64), lpcjax and the peers
#   6. train       a step of FoX (Pro) and Transformer (Pro) 125M at T = 4096; one of LPC-SM, SITH
#                  and PMT tiny (train_step.py)
#   7. decode      FoX (Pro) 125M cached decoding, prompt 4k and 32k, batch 1 and 16; fla's alike
#   8. tests       the kernel test suite compiled (tests/kernels), in what time is left
# STEPS="check attn16k ..." runs only those (a second run after a fix). The JSON goes to
# benchmarks/results/ (a user's own GPU); in a device session ($OUT set) to a scratch folder,
# packed after every step into $OUT/gpu_results.tar, with $OUT/gpu_check.log beside it.
#   here, once:  bash benchmarks/gpu_wheels.sh     # packages the device lacks -> .whl/, peers -> .peers/
#   device:      bash benchmarks/gpu_check.sh      # (carry .whl and .peers)
#   rehearsal:   REHEARSE=1 OUT=/tmp/gpu bash benchmarks/gpu_check.sh   # every step at toy sizes on a
#                CPU: the Pallas kernels and the peers' Triton kernels interpreted, GPU-only rows skipped
. "$(dirname "$0")/gpu_setup.sh"
steps=" ${STEPS:-check attn16k peers16k pruning sweep train decode tests} "
if [ -n "${OUT:-}${REHEARSE:-}" ]; then results=$(mktemp -d); else results=$out; fi
log="$out/gpu_check.log"
: > "$log"

if [ -n "${REHEARSE:-}" ]; then  # toy sizes: every path that runs without a GPU
  export JAX_PLATFORMS=cpu
  long=256 sweep_lens="128" tokens=512 model_dim=256 iters=1 peers="--interpret --dtype float16" scale=4 budget=1800
  check_args="--impls xla pallas auto --interpret --max-seq-len 256" check_len=128
  train_size="data.seq_len=64 data.batch_size=1 model.d_model=64 model.num_layers=1 model.num_heads=1"
  decode_args="--prompt-lens 64 --batch-sizes 1 2 --new-tokens 2 --recompute-tokens 1"
  fla_decode_args="--hidden-size 64 --layers 1 --heads 2 --prompt-lens 40 --batch-sizes 2 --new-tokens 2"
else
  long=16384 sweep_lens="2048 8192 32768" tokens=32768 model_dim=2048 iters=5 peers="" check_len=1024 scale=1 budget=530
  check_args="--impls pallas triton mosaic_gpu mosaic_gpu_hw mosaic_gpu_fused mosaic_gpu_v1"  # ("auto": pallas on a GPU)
  train_size="data.seq_len=4096 data.batch_size=8"
  # (--recompute-tokens 0: the uncached forward's [16, 32k, vocab] logits alone need 99 GiB)
  decode_args="--config paper:fox_pro_125m --prompt-lens 4096 32768 --batch-sizes 1 16 --new-tokens 64
    --recompute-tokens 0"
  fla_decode_args="--prompt-lens 4096 32768 --batch-sizes 1 16 --new-tokens 64"
fi
deadline=${BUDGET:-$budget}  # seconds since the script began (bash SECONDS), setup included
rows="--batch-tokens $tokens --model-dim $model_dim --iters $iters"
# the floors right after the backends "auto" may pick, so that a step's cap cuts the comparisons last
lpcjax_impls="pallas triton mosaic_gpu cudnn_nobias pallas_mha_nobias mosaic_gpu_hw mosaic_gpu_fused mosaic_gpu_v1
  xla auto mosaic_gpu_hw_no_turns mosaic_gpu_hw_no_early_release"

pack() {  # the results so far, whole, into $OUT (a timeout keeps every finished step)
  [ -n "${OUT:-}" ] || return 0
  tar -cf "$OUT/gpu_results.tar.part" -C "$results" . && mv "$OUT/gpu_results.tar.part" "$OUT/gpu_results.tar"
}

run() {  # CAP NAME COMMAND...: at most CAP seconds and what is left; logged; a failure goes on
  local cap=$(($1 * scale)) name=$2 left=$((deadline - SECONDS)) status
  shift 2
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 10 ]; then
    echo "== $name: skipped, the budget is spent" | tee -a "$log"; return
  fi
  echo "== $name (at most $cap s; $(date -u +%T))" | tee -a "$log"
  timeout -k 10 "$cap" "$@" > "$results/$name.log" 2>&1
  status=$?
  grep -v -i -E "warning|warn\(" "$results/$name.log" | tail -n 14
  cat "$results/$name.log" >> "$log"
  [ "$status" -eq 0 ] || echo "   $name: exit $status$( [ "$status" -eq 124 ] && echo ', timed out')" | tee -a "$log"
  pack
}
wants() { [[ "$steps" == *" $1 "* ]]; }

if wants check; then
  run 90 kernel_check $py benchmarks/kernel_check.py $check_args --out "$results/kernel_check_gpu.json"
fi
if wants attn16k; then
  run 50 attention_16k $py benchmarks/attention.py --seq-lens $long --head-dims 128 $rows \
    --impls $lpcjax_impls --out "$results/attention_gpu_16k.json"
fi
if wants peers16k; then
  run 50 peers_16k $py benchmarks/attention_peers.py --seq-lens $long --head-dims 128 $rows $peers \
    --check-len $check_len --out "$results/attention_peers_gpu_16k.json"
fi
if wants pruning; then
  run 40 pruning $py benchmarks/attention.py --seq-lens $long --head-dims 128 $rows --gate-timescales 32 2048 \
    --impls pallas pallas_pruned triton triton_pruned --out "$results/attention_pruning_gpu.json"
  run 30 peers_pruning $py benchmarks/attention_peers.py --seq-lens $long --head-dims 128 $rows $peers \
    --gate-timescales 32 2048 --impls fox_official fox_official_acp --check-len 0 \
    --out "$results/attention_peers_pruning_gpu.json"
fi
if wants sweep; then
  run 30 attention_16k_d64 $py benchmarks/attention.py --seq-lens $long --head-dims 64 $rows \
    --impls $lpcjax_impls --out "$results/attention_gpu_16k_d64.json"
  run 60 attention_sweep $py benchmarks/attention.py --seq-lens $sweep_lens --head-dims 128 64 $rows \
    --impls $lpcjax_impls --out "$results/attention_gpu.json"
  run 45 peers_sweep $py benchmarks/attention_peers.py --seq-lens $sweep_lens $long --head-dims 128 64 $rows \
    $peers --check-len 0 --out "$results/attention_peers_gpu.json"
fi
if wants train; then
  run 90 train_125m $py benchmarks/train_step.py --config paper:fox_pro_125m --set $train_size \
    --families fox transformer --steps 5 --rounds 2 --peak-tflops 989 --out "$results/train_step_gpu.json"
  for config in lpcsm:tiny sith:tiny_L37 pmt:synthetic; do
    family=${config%%:*}
    run 35 "train_$family" $py benchmarks/train_step.py --config $config --families $family --steps 3 \
      --rounds 1 --peak-tflops 989 --out "$results/train_step_${family}_tiny_gpu.json"
  done
fi
if wants decode; then
  run 50 decode $py benchmarks/decode.py --families fox $decode_args --out "$results/decode_gpu.json"
  run 30 decode_fla $py benchmarks/decode_peers.py $fla_decode_args ${REHEARSE:+--interpret --dtype float16 \
    --vocab-size 512} --out "$results/decode_peers_gpu.json"
fi
if wants tests && [ -z "${REHEARSE:-}" ]; then
  # (test_triton_kernels.py and test_mosaic_gpu.py run their kernels interpreted on the CPU:
  # skipped here, where the shared suite runs impl="triton" compiled and step 1 mosaic_gpu)
  run 120 kernel_tests $py -m pytest -q -p no:cacheprovider tests/kernels \
    --ignore tests/kernels/test_triton_kernels.py --ignore tests/kernels/test_mosaic_gpu.py
fi
echo "done in $SECONDS s; results: ${OUT:+$OUT/gpu_results.tar, }$results" | tee -a "$log"
