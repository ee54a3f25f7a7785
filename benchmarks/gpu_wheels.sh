#!/usr/bin/env bash
# Run here, once, before a device session: downloads into .whl/ the packages lpcjax needs that
# the H200 machine's image lacks (grain and its missing dependencies; jax-triton for impl="triton":
# 0.3.1, the release that takes the image's triton 3.6, since a triton >= 3.7 wheel for 0.4.x is
# ~200 MB, past what a device call carries), for its Python 3.12; and setuptools, because
# gpu_setup.sh builds lpcjax there with --no-build-isolation (no network) and pyproject.toml's
# SPDX `license` needs setuptools >= 77, newer than the image may hold; fla (fla-core and
# flash-linear-attention, the peer of benchmarks/attention_peers.py: it needs einops and
# transformers >= 5.6.2, both on the image). And the official FoX kernel, the other peer: the one
# file of the authors' repository that holds it, into .peers/fox_official/ (ignored, never
# committed), with the commit it came from; FOX_REPO=path names a local clone (bare or not),
# else it is cloned from GitHub.
# The device has no network; benchmarks/gpu_check.sh installs whatever .whl/ holds (.gitignore
# keeps .whl/ out of the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 importlib_resources==7.1.0 jax-triton==0.3.1 \
  setuptools==80.9.0 fla-core==0.6.0 flash-linear-attention==0.6.0
fox_repo="${FOX_REPO:-}"
if [ -z "$fox_repo" ]; then
  fox_repo=$(mktemp -d)
  trap 'rm -rf "$fox_repo"' EXIT
  git clone -q --depth 1 https://github.com/zhixuan-lin/forgetting-transformer "$fox_repo"
fi
mkdir -p .peers/fox_official
git -C "$fox_repo" show HEAD:src/forgetting_transformer/ops/forgetting_attention.py \
  > .peers/fox_official/forgetting_attention.py.tmp
mv .peers/fox_official/forgetting_attention.py.tmp .peers/fox_official/forgetting_attention.py
git -C "$fox_repo" rev-parse HEAD > .peers/fox_official/COMMIT
ls -l .whl .peers/fox_official
