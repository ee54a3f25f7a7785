"""impl="triton" through jax-triton: its install errors everywhere, and on Python >= 3.12 with
jax >= 0.11 (the [triton] extra; .ci/run's second venv) its lowering for CUDA without a GPU.

How far that lowering goes here: jax-triton compiles every kernel (Triton IR -> PTX -> cubin,
ptxas from the triton wheel) for the compute capability given, and with jax-cuda12-plugin
present (only its Triton custom-call module is used; no CUDA driver needed) wraps each in an XLA
``triton_kernel_call`` custom call, so the whole forward+backward program lowers to StableHLO.
Only XLA's compilation of that program and running it need a GPU (benchmarks/gpu_check.sh).
"""

import functools
import importlib.util

import jax
import jax.numpy as jnp
import pytest

from lpcjax.kernels import BlockSizes, forgetting_attention, triton_backend

HAS_JAX_TRITON = importlib.util.find_spec("jax_triton") is not None


def qkv_and_gate(seq_len=16, head_dim=16, dtype=jnp.float32):
  x = jnp.ones((1, seq_len, 2, head_dim), dtype)
  return x, x, x, jnp.zeros((1, seq_len, 2), jnp.float32)


@pytest.mark.skipif(HAS_JAX_TRITON, reason="jax-triton is installed")
def test_without_jax_triton_the_error_is_one_line_saying_what_to_install():
  with pytest.raises(ImportError) as error:
    forgetting_attention(*qkv_and_gate(), impl="triton")
  message = str(error.value)
  assert "\n" not in message and "pip install 'lpcjax[triton]'" in message
  assert "Python >= 3.12" in message and "jax >= 0.11" in message


@pytest.mark.skipif(not HAS_JAX_TRITON, reason="needs jax-triton (Python >= 3.12)")
def test_off_gpu_the_error_says_so():
  if jax.default_backend() == "gpu":
    pytest.skip("a GPU is present")
  with pytest.raises(ValueError, match="impl='triton' needs a GPU"):
    forgetting_attention(*qkv_and_gate(), impl="triton")
  with pytest.raises(ValueError, match="no interpret mode"):
    forgetting_attention(*qkv_and_gate(), impl="triton", interpret=True)


def test_unsupported_head_dim_and_auto():
  with pytest.raises(ValueError, match="impl='triton' supports head_dim in"):
    forgetting_attention(*qkv_and_gate(head_dim=48), impl="triton")
  from lpcjax.kernels import available_impls, resolve
  assert "triton" in available_impls()
  with pytest.MonkeyPatch.context() as patch:  # "auto" keeps Pallas on a GPU
    patch.setattr(jax, "default_backend", lambda: "gpu")
    assert resolve("auto", 64).name == "pallas"


# ------------------------------------------------------------------ lowering (Python >= 3.12)

def lowering_available():
  if not HAS_JAX_TRITON:
    return "needs jax-triton (the [triton] extra, Python >= 3.12)"
  if all(importlib.util.find_spec(f"jax_cuda{v}_plugin") is None for v in (12, 13)):
    return "needs jax-cuda12-plugin (its Triton custom call) to lower for CUDA"
  return None


lowering = pytest.mark.skipif(lowering_available() is not None,
                              reason=lowering_available() or "")


@pytest.fixture
def for_h200(monkeypatch):
  """Lower for compute capability 9.0 (an H100/H200) on a machine that has no GPU to ask."""
  monkeypatch.setattr(triton_backend, "launcher",
                      functools.partial(triton_backend.jax_triton_call, compute_capability=90))


def lowered_text(dtype, head_dim, seq_len=200, **options):
  def loss(q, k, v, log_f, seg):
    o = forgetting_attention(q, k, v, log_f, segment_ids=seg, impl="triton", **options)
    return jnp.sum(o.astype(jnp.float32))
  qkv = jax.ShapeDtypeStruct((1, seq_len, 2, head_dim), dtype)
  specs = (qkv, qkv, qkv, jax.ShapeDtypeStruct((1, seq_len, 2), jnp.float32),
           jax.ShapeDtypeStruct((1, seq_len), jnp.int32))
  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  return grad.trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


# forward, dK/dV/dc, dQ, and for bf16/fp16 the row-term kernel (kernels/row_term.py)
@lowering
@pytest.mark.parametrize("dtype,head_dim,options", [
    (jnp.bfloat16, 64, dict(prune_epsilon=1e-4, window=40)),
    # float32 multiplies in IEEE float32 on the FMA units, fully unrolled: with the default
    # 128-wide tiles ptxas takes 20 s at d = 32 and over a minute at d = 128, so small tiles here.
    (jnp.float32, 32, dict(block_sizes=BlockSizes(32, 32))),
    (jnp.float16, 16, dict(window=1)),
], ids=["bf16-d64-pruned-window", "f32-d32", "f16-d16-w1"])
def test_lowers_for_cuda_without_a_gpu(for_h200, dtype, head_dim, options):
  text = lowered_text(dtype, head_dim, **options)
  assert text.count("triton_kernel_call") == (3 if dtype == jnp.float32 else 4)


@lowering
def test_lowers_under_x64_and_shard_map(for_h200, x64):
  """jax_enable_x64 (Python ints as int64) inside the models' shard_map over batch and heads."""
  from jax.sharding import AxisType
  from lpcjax.kernels import sharded_forgetting_attention
  mesh = jax.sharding.AbstractMesh((1, 1), ("data", "tensor"), (AxisType.Auto,) * 2)
  qkv = jax.ShapeDtypeStruct((2, 64, 2, 32), jnp.bfloat16)
  gate = jax.ShapeDtypeStruct((2, 64, 2), jnp.float32)

  def loss(q, k, v, f):
    o = sharded_forgetting_attention(q, k, v, f, mesh=mesh, batch_axes="data", head_axes="tensor",
                                     impl="triton", window=16)
    return jnp.sum(o.astype(jnp.float32))
  with jax.sharding.use_abstract_mesh(mesh):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(qkv, qkv, qkv, gate).lower(
        lowering_platforms=("cuda",)).as_text()
  assert text.count("triton_kernel_call") == 4
