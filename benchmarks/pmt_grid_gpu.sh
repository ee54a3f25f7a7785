#!/usr/bin/env bash
# Issue #37's PMT grid on its longest UCR set, EOGHorizontalSignal (about 16 hours of the 2-core
# CPU machine; the CPU grids hold the other sets, Computers included; SETS adds any) on the GPU
# machine: PMT, lambda_PCL = 0 and matched full attention at the 1,500-step recipe, seeds 0-2, with
# the random init of each (--random-init-all), probed as the CPU grids (docs/pmt_results.md). Seed by seed,
# each seed one driver call adding its cells to the same JSON, so a timeout keeps every whole seed;
# the same command again on the still-warm machine continues (cells checkpoint every 100 steps
# under runs/, which stays there between calls). On an H200 (2026-12-04) three full-attention cells
# side by side took 334 s with setup and probes; six PMT / lambda_PCL = 0 cells side by side then
# trained at 12-13 steps/s each but did not reach their probes in the session's 15 device minutes,
# so the whole grid needs more than one device session: give each its VARIANTS.
# The cells' configs, metrics and eval results come back as one tar.gz beside the JSON.
#   here, once:  bash benchmarks/gpu_wheels.sh && bash benchmarks/pmt_grid_gpu.sh --stage
#   device:      bash benchmarks/pmt_grid_gpu.sh     (carry .whl and .ucr; BUDGET=seconds, default 540)
# SETS, VARIANTS, SEEDS, STEPS and JOBS override the grid. A SEEDS word of commas ("0,1,2") is one
# driver call over those seeds, their cells all at once (more cells share the GPU; a timeout keeps
# the cells that finished, in the tar.gz). A tiny CPU rehearsal (Python 3.12, as the device's):
# SETS=ECG200 bash benchmarks/pmt_grid_gpu.sh --stage, then
# JAX_PLATFORMS=cpu SETS=ECG200 VARIANTS=full_matched SEEDS=0,1 STEPS=3 OUT=/tmp/g \
#   bash benchmarks/pmt_grid_gpu.sh
sets=(${SETS:-EOGHorizontalSignal})
variants=(${VARIANTS:-pmt pmt_no_pcl full_matched})
if [ "${1:-}" = "--stage" ]; then  # copy the sets out of ../shared (which does not travel) into .ucr/
  cd "$(dirname "$0")/.." && mkdir -p .ucr
  for set in "${sets[@]}"; do cp -r "../shared/data/ucr/$set" .ucr/; done
  du -sh .ucr; exit
fi
. "$(dirname "$0")/gpu_setup.sh"
deadline=$((SECONDS + ${BUDGET:-540}))
# A seed's cells (three a set) share the GPU: none may take most of its memory up front. float32 matmuls
# as on the CPU (no TF32), so that the cells compare with the CPU grids' figures.
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest
export TQDM_MININTERVAL=30  # the cells' progress bars, in the log every 30 s
# The seeds share their programs: a persistent compilation cache compiles each variant's once.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/lpcjax-jax-cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
for seed in ${SEEDS:-0 1 2}; do
  seeds=(${seed//,/ })
  left=$((deadline - SECONDS))
  [ "$left" -gt 30 ] || break
  # (output to a file, not a pipe: after a timeout the cells outlive the driver until told to stop)
  timeout "$left" $py benchmarks/pmt_pretraining.py --sets "${sets[@]}" \
    --variants "${variants[@]}" --random-init-all --seeds "${seeds[@]}" --steps "${STEPS:-1500}" \
    --label-seeds 5 --gaps 0,1,2 --extra train.checkpoint_every=100 \
    --jobs "${JOBS:-$((${#variants[@]} * ${#seeds[@]} * ${#sets[@]}))}" \
    --run-dir runs/pmt_grid_gpu --ucr-dir .ucr --out "$out/pmt_grid_gpu.json" >> "$out/pmt_grid_gpu.log" 2>&1
  status=$?
  echo "seed $seed: exit $status at ${SECONDS} s" | tee -a "$out/pmt_grid_gpu.log"
  if [ "$status" -ne 0 ]; then  # timed out or failed: each cell saves its checkpoint on TERM
    pkill -TERM -f "train.py --resume-or-start --config pmt:"; sleep 20; break
  fi
done
tar czf "$out/pmt_grid_gpu_runs.tar.gz" --exclude=checkpoints runs/pmt_grid_gpu
ls -l "$out"
