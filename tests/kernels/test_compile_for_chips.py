"""Every accelerator kernel compiled ahead of time for the chips it targets, on this CPU machine,
by the real compilers (lpcjax.aot): XLA's GPU pipeline, Mosaic GPU and ptxas for an H100
(sm_90a), libtpu's Mosaic for TPU v5e and v6e. An interpreter checks numerics; only these
compilers say whether a kernel builds, and with how many registers. CI's small grid: bf16 at
D 64 and 128 with grouped K/V, a window, segments and pruning for the GPU backends (pallas,
triton, mosaic_gpu, its one-kernel backward mosaic_gpu_fused and the hardware path), none of which
may spill registers, the TPU kernel in
bf16 and float32, the ring's pair kernels over two GPUs, and a FoX training step with the
backend "auto" picks on an H100 and on a v5e. benchmarks/compile_check.py runs the full grid
(every backend's training step too) and writes the resource table.

Runs where the compilers are installed (``pip install "lpcjax[aot]"``: CI's Python 3.12 leg);
elsewhere each test skips in one line.
"""

import importlib.util

import pytest

from lpcjax.kernels import mosaic_gpu

aot = pytest.importorskip("lpcjax.aot.attention_check")
from lpcjax.aot import compile_only_devices  # noqa: E402



def installed(module):
  try:
    return importlib.util.find_spec(module) is not None
  except ImportError:  # its parent package is missing
    return False


HAVE_GPU_COMPILER = installed("jax_plugins.xla_cuda12")
HAVE_TPU_COMPILER = installed("libtpu")
needs_gpu_compiler = pytest.mark.skipif(not (HAVE_GPU_COMPILER and mosaic_gpu.available()),
                                        reason="needs the [aot] extra (jax-cuda12-plugin, jax >= 0.11.2)")
needs_tpu_compiler = pytest.mark.skipif(not HAVE_TPU_COMPILER, reason="needs the [aot] extra (libtpu)")
SMEM_PER_BLOCK = 227 * 1024  # Hopper's opt-in maximum per block
# jax 0.11 warns at every lowering of impl="pallas" that Pallas' Triton backend is deprecated
# (README); expected here, where lowering it is the point.
pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")
FEATURES = dict(heads=4, kv_heads=2, window=512, segments=True, prune=True)  # GQA 2, window, segments, pruning


@pytest.fixture(scope="module")
def h100():
  return compile_only_devices("h100")[0]


def compiled(case, device):
  row = aot.compile_attention(case, device)
  assert row["compiled"], row["error"]
  return {kernel["name"]: kernel for kernel in row["kernels"]}


GPU_CASES = [aot.AttentionCase(impl, "bfloat16", head_dim, 2048, **FEATURES)
             for impl in ("pallas", "triton") for head_dim in (64, 128)]
# the context-parallel ring's pair kernels, over two compile-only H100s
GPU_CASES.append(aot.AttentionCase("pallas", "bfloat16", 128, 4096, context=2, **FEATURES))


def assert_built_for_hopper(kernels, count=4):
  """``count`` kernels, each with a tensor-core loop, shared memory within a block's limit, no
  register spills and no ptxas warning."""
  assert len(kernels) == count, sorted(kernels)
  for name, kernel in kernels.items():
    assert kernel.get("smem_bytes") is None or kernel["smem_bytes"] <= SMEM_PER_BLOCK, (name, kernel)
    assert any(loop.get("tensor") for loop in kernel["loops"]), f"{name}: no tensor-core loop"
  spills = {name: (k["spill_store_bytes"], k["spill_load_bytes"]) for name, k in kernels.items()
            if k["spill_store_bytes"] or k["spill_load_bytes"]}
  assert not spills, spills
  warned = {name: k["ptxas_warnings"] for name, k in kernels.items() if k.get("ptxas_warnings")}
  assert not warned, warned  # e.g. wgmma serialized (register operands ptxas cannot keep in flight)


@needs_gpu_compiler
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda case: case.name)
def test_forward_and_backward_compile_for_hopper(case):
  """Four kernels each assembled for sm_90a (forward, row term, dQ, dK/dV), shared memory within
  a block's limit, and no register spills at the default tiles."""
  if case.impl == "triton":
    pytest.importorskip("jax_triton")
  assert_built_for_hopper(compiled(case, compile_only_devices(f"h100x{case.context}" if case.context > 1
                                                              else "h100")))


@needs_gpu_compiler
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mosaic_gpu_and_its_hardware_path_compile_for_hopper(h100, head_dim):
  """Version 2 (impl="mosaic_gpu": forward, the gradient's two-part forward, dQ, dK/dV), its
  one-kernel backward (impl="mosaic_gpu_fused": forwards and dK/dV/dQ) and the hardware path
  (that, with register operands), each as test_forward_and_backward_compile_for_hopper asks
  (version 2's dK/dV spilled 412 B at D = 128 before its accumulators moved in place; the
  one-kernel backward 396-780 B while pruning set its sweep's end, docs/kernels_mosaic_gpu.md).
  The one-kernel backward's loop holds the five matmul units of a tile (both warpgroups' roles);
  the forwards' loops the units of their key tiles (128 wide at D = 64, and on the hardware path
  at D = 128); the hardware path's kernels ask the fused ones' SMEM less exactly the tiles of
  the A operands it keeps in registers (P^T in the backward, 64 x 64 bf16; P and P's residual
  in the forwards, 64 x 128 per compute warpgroup, where both paths' key tiles are as wide),
  and are named with "_hw" so that a profile tells them apart."""
  v2, fused, hw = (compiled(aot.AttentionCase(impl, "bfloat16", head_dim, 2048, **FEATURES), h100)
                   for impl in ("mosaic_gpu", "mosaic_gpu_fused", "mosaic_gpu_hw"))
  prefix = "forgetting_attention_mgpu_"
  assert_built_for_hopper(v2)
  assert sorted(v2) == sorted(prefix + kernel for kernel in ("fwd", "fwd_two_part", "dq", "dkv")), sorted(v2)
  units = lambda kernel: max(loop.get("units", 0) for loop in kernel["loops"])
  for kernels, suffix in ((fused, ""), (hw, "_hw")):
    assert_built_for_hopper(kernels, count=3)
    assert sorted(kernels) == sorted(prefix + kernel + suffix for kernel in ("fwd", "fwd_two_part", "dkv_dq"))
    assert units(kernels[f"{prefix}dkv_dq{suffix}"]) == 5 * head_dim / 128  # S, dP, dV, dK, dQ (64 x 64 x 128 each)
  assert fused[f"{prefix}dkv_dq"]["smem_bytes"] - hw[f"{prefix}dkv_dq_hw"]["smem_bytes"] == 64 * 64 * 2  # P^T
  # the forwards' key tiles (Version.wide_forward_keys: 128 where SMEM allows), read off their
  # units; where both paths have the same, the hardware path asks P's (and its residual's) tiles less
  widths = [mosaic_gpu.forward_key_tile(version, head_dim) for version in (mosaic_gpu.V2, mosaic_gpu.V2_HARDWARE)]
  assert widths == ([128, 128] if head_dim == 64 else [64, 128]), widths
  for kernel, parts in (("fwd", 1), ("fwd_two_part", 2)):
    for kernels, suffix, width in ((v2, "", widths[0]), (fused, "", widths[0]), (hw, "_hw", widths[1])):
      assert units(kernels[prefix + kernel + suffix]) == (parts + 1) * width / 64 * head_dim / 128, kernel
    if widths[0] == widths[1]:
      saved = parts * 2 * 64 * widths[0] * 2  # per compute warpgroup, bf16
      assert v2[prefix + kernel]["smem_bytes"] - hw[f"{prefix}{kernel}_hw"]["smem_bytes"] == saved, kernel


@needs_tpu_compiler
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_tpu_kernels_compile_within_scoped_vmem(chip, dtype):
  """bf16 failed here before ("Bad lhs type": a float32 contract precision on bf16 operands);
  each kernel's VMEM stays within the chip's default scoped limit."""
  from lpcjax.aot.targets import TPU_CHIPS
  device = compile_only_devices(chip)[0]
  kernels = compiled(aot.AttentionCase("pallas_tpu", dtype, 128, 2048, **FEATURES), device)
  assert len(kernels) == (4 if dtype == "bfloat16" else 3), sorted(kernels)  # float32: no row-term kernel
  for name, kernel in kernels.items():
    assert 0 < kernel["vmem_bytes"] <= TPU_CHIPS[chip].scoped_vmem_bytes, (name, kernel)


@needs_gpu_compiler
def test_a_miscompiling_ptxas_is_refused_before_mosaic_gpu_compiles(h100, monkeypatch):
  monkeypatch.setattr(mosaic_gpu, "ptxas_version", lambda: (12, 8, 93))
  row = aot.compile_attention(aot.AttentionCase("mosaic_gpu", head_dim=64, seq_len=256), h100, reports=False)
  assert not row["compiled"] and "miscompiles causal masks" in row["error"]


# What "auto" picks on each chip (every backend's step: benchmarks/compile_check.py --only steps)
STEP_CASES = [("h100", "pallas"), ("v5e", "pallas_tpu")]


@pytest.mark.parametrize("target, impl", STEP_CASES)
def test_a_fox_training_step_compiles(target, impl):
  """The trainer's own step (model, loss, AdamW update) for a tiny FoX at head dim 64 in bf16,
  with the backend named, compiled for one chip."""
  if not (HAVE_GPU_COMPILER and mosaic_gpu.available() if target == "h100" else HAVE_TPU_COMPILER):
    pytest.skip("needs the [aot] extra")
  if impl == "triton":
    pytest.importorskip("jax_triton")
  from lpcjax import experiment
  from lpcjax.aot.train_step import compile_train_step
  config = experiment.apply_overrides(experiment.load_experiment("fox_tiny_mqar"), [
      "model.d_model=128", "model.num_heads=2", "model.dtype=bfloat16", "data.seq_len=256",
      "data.batch_size=8", f"model.attention_impl={impl}"])
  compiled_step = compile_train_step(config, compile_only_devices(target))
  kernel_calls = {"pallas_tpu": "tpu_custom_call", "pallas": "__gpu$xla.gpu.triton",
                  "triton": "triton_kernel_call", "mosaic_gpu": "mosaic_gpu"}[impl]
  assert kernel_calls in compiled_step.as_text()
  assert compiled_step.memory_analysis() is not None
