"""The Pallas kernels lower through Pallas-Triton for an NVIDIA GPU, checked on any machine.

Interpret mode (the backend tests) runs the kernels' jaxpr on the CPU; it never meets the
Triton lowering, which rejects what a GPU cannot do (unsupported primitives, array shapes that
are not powers of two, scalar/vector mixing). Lowering for the "cuda" platform needs no GPU, so
these tests run that translation in CI for every head dim, dtype, and with pruning, segments
and padding. The target is an abstract H200 (JAX >= 0.11 reads the GPU generation from the
mesh's device). tests/kernels/test_compile_for_chips.py goes on to PTX and machine code (Python 3.12).
"""

import contextlib

import jax
import jax.numpy as jnp
import pytest

from lpcjax.kernels import forgetting_attention, pallas_gpu


def target_gpu():
  """A context in which lowering targets an H200, where this JAX lets one say so."""
  if not hasattr(jax.sharding, "AbstractDevice"):
    return contextlib.nullcontext()
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), (jax.sharding.AxisType.Explicit,),
                                   abstract_device=device)
  return jax.sharding.use_abstract_mesh(mesh)


def lower_for_cuda(fn, *args):
  with target_gpu():
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


# Lowering errors fail these tests; only a JAX without Pallas' Triton backend skips them.
pytestmark = pytest.mark.skipif(pallas_gpu.plgpu is None,
                                reason="jax.experimental.pallas.triton is missing")


@pytest.fixture(autouse=True)
def pretend_gpu(monkeypatch):
  # The backend refuses un-interpreted calls off-GPU; here nothing runs, it only lowers.
  monkeypatch.setattr(pallas_gpu, "on_gpu", lambda: True)


def loss_and_grads(prune_epsilon=None, segments=False, window=None):
  def loss(q, k, v, log_f, seg):
    o = forgetting_attention(q, k, v, log_f, segment_ids=seg if segments else None, impl="pallas",
                             prune_epsilon=prune_epsilon, window=window)
    return jnp.sum(o.astype(jnp.float32))
  return jax.grad(loss, argnums=(0, 1, 2, 3))


def specs(seq_len, head_dim, dtype, batch=1, heads=2):
  qkv = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), dtype)
  return (qkv, qkv, qkv, jax.ShapeDtypeStruct((batch, seq_len, heads), jnp.float32),
          jax.ShapeDtypeStruct((batch, seq_len), jnp.int32))


def triton_kernel_count(text):
  return text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call")


# forward, dK/dV/dc, dQ, and for bf16/fp16 the row-term kernel (kernels/row_term.py)
KERNELS = {jnp.bfloat16: 4, jnp.float16: 4, jnp.float32: 3}


@pytest.mark.parametrize("head_dim", pallas_gpu.SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_forward_and_backward_lower(head_dim, dtype):
  text = lower_for_cuda(loss_and_grads(), *specs(256, head_dim, dtype))
  assert triton_kernel_count(text) == KERNELS[dtype]


def test_lowers_under_x64(x64):
  """Under jax_enable_x64 Python ints trace as int64 next to the int32 program ids."""
  text = lower_for_cuda(loss_and_grads(prune_epsilon=1e-4, segments=True, window=40),
                        *specs(200, 64, jnp.bfloat16))
  assert triton_kernel_count(text) == KERNELS[jnp.bfloat16]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_pruning_segments_and_padding_lower(head_dim):
  # 200 is not a multiple of any block; pruning adds a lax.cond to every off-diagonal loop.
  text = lower_for_cuda(loss_and_grads(prune_epsilon=1e-4, segments=True),
                        *specs(200, head_dim, jnp.bfloat16))
  assert triton_kernel_count(text) == KERNELS[jnp.bfloat16]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_window_lowers(head_dim):
  # A window adds band-masked loops with traced bounds to every sweep, next to pruning's conds.
  text = lower_for_cuda(loss_and_grads(prune_epsilon=1e-4, segments=True, window=100),
                        *specs(300, head_dim, jnp.bfloat16))
  assert triton_kernel_count(text) == KERNELS[jnp.bfloat16]


def test_grouped_query_attention_lowers():
  """k, v with 2 heads for 8 query heads: the k/v block specs read head h // 4; dK/dV come out
  per query head in float32 and are summed outside the kernels."""
  q = jax.ShapeDtypeStruct((1, 200, 8, 64), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((1, 200, 2, 64), jnp.bfloat16)
  text = lower_for_cuda(loss_and_grads(prune_epsilon=1e-4, segments=True, window=100), q, kv, kv,
                        jax.ShapeDtypeStruct((1, 200, 8), jnp.float32), jax.ShapeDtypeStruct((1, 200), jnp.int32))
  assert triton_kernel_count(text) == KERNELS[jnp.bfloat16]


def test_unsupported_head_dim_is_refused():
  with pytest.raises(ValueError, match="head_dim"):
    lower_for_cuda(loss_and_grads(), *specs(64, 48, jnp.bfloat16))


def ring_lowered(dtype, window=None, prune_epsilon=None, devices=4, seq_len=256, heads=2, kv_heads=2):
  """The context-parallel ring over an abstract mesh of H200s, its chunk pairs run by the
  Pallas kernels (heads-major chunks, traced offsets, separate row and column vectors)."""
  from lpcjax.kernels import sharded_forgetting_attention
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
  mesh = jax.sharding.AbstractMesh((devices,), ("context",), (jax.sharding.AxisType.Auto,),
                                   abstract_device=device)

  def loss(q, k, v, log_f, seg):
    o = sharded_forgetting_attention(q, k, v, log_f, mesh=mesh, context_axis="context", segment_ids=seg,
                                     impl="pallas", window=window, prune_epsilon=prune_epsilon)
    return jnp.sum(o.astype(jnp.float32))
  q = jax.ShapeDtypeStruct((1, seq_len, heads, 64), dtype)
  kv = jax.ShapeDtypeStruct((1, seq_len, kv_heads, 64), dtype)
  args = (q, kv, kv, jax.ShapeDtypeStruct((1, seq_len, heads), jnp.float32),
          jax.ShapeDtypeStruct((1, seq_len), jnp.int32))
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("dtype,window,prune,kernels", [
    # balanced layout: 4 chunk pairs a step, traced twice (the scan's body and the last step):
    # 8 forward, 8 dQ, 8 dK/dV (+ 8 row terms for bf16) kernels
    (jnp.float32, None, None, 24),
    (jnp.bfloat16, None, 1e-4, 32),
    # a window: contiguous, one pair a step
    (jnp.bfloat16, 80, 1e-4, 8),
], ids=["f32-balanced", "bf16-balanced-pruned", "bf16-window-pruned"])
def test_ring_pair_kernels_lower(dtype, window, prune, kernels):
  assert triton_kernel_count(ring_lowered(dtype, window, prune)) == kernels


def test_ring_pair_kernels_lower_with_gqa_under_x64(x64):
  """Grouped-query heads (K, V at 2 heads for 8) and int64 Python ints beside int32 offsets."""
  assert triton_kernel_count(ring_lowered(jnp.bfloat16, 80, 1e-4, heads=8, kv_heads=2)) == 8
