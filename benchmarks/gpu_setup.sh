# Sourced by the scripts of a device session (gpu_check.sh, pmt_grid_gpu.sh): moves to the
# checkout's root, sets $out (logs and JSON: $OUT, or benchmarks/results/) and $py (python3, or $PY), installs the
# wheels carried in .whl/ (benchmarks/gpu_wheels.sh; the device has no network) and lpcjax, and
# records the machine in $out/gpu_env.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PY:-python3}
# No network there: install what was carried, built for the device's Python 3.12 (a rehearsal
# under another Python, PY=..., uses that environment's own packages).
if compgen -G ".whl/*.whl" > /dev/null && $py -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# --no-build-isolation: no network to fetch a build backend; the carried setuptools (first on
# PYTHONPATH) builds it, since pyproject.toml's SPDX license needs setuptools >= 77.
$py -m pip install -q --no-deps --no-build-isolation -e . || exit 1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $py -c "import jax; print('jax', jax.__version__, jax.devices())"; } 2>&1 | tee "$out/gpu_env.txt"
