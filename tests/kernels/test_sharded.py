"""The shard_map-wrapped op and the model under a mesh equal their unsharded results."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from lpcjax import models
from lpcjax.kernels import forgetting_attention, sharded_forgetting_attention
from lpcjax.sharding import DEFAULT_RULES

from test_forgetting_attention import make_inputs, segments_from_starts


def mesh_of(shape, names):
  if len(jax.devices()) < 4:
    pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names), devices=jax.devices()[:4])


@pytest.mark.parametrize("impl,interpret", [("xla", False), ("pallas", True)])
def test_sharded_op_equals_unsharded(impl, interpret):
  mesh = mesh_of((2, 2), ("data", "tensor"))
  q, k, v, log_f, do = make_inputs(7, 4, 40, 4, 16)
  seg = segments_from_starts(4, 40, [17])
  options = dict(segment_ids=seg, impl=impl, interpret=interpret)

  def loss(fn):
    return lambda q, k, v, f: jnp.sum(fn(q, k, v, f) * do)

  plain = lambda q, k, v, f: forgetting_attention(q, k, v, f, **options)
  sharded = lambda q, k, v, f: sharded_forgetting_attention(q, k, v, f, mesh=mesh, batch_axes="data",
                                                            head_axes="tensor", **options)
  put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
  args = (put(q, P("data", None, "tensor", None)), put(k, P("data", None, "tensor", None)),
          put(v, P("data", None, "tensor", None)), put(log_f, P("data", None, "tensor")))
  out = jax.jit(sharded)(*args)
  assert out.sharding.spec == P("data", None, "tensor", None)
  np.testing.assert_allclose(out, plain(q, k, v, log_f), atol=1e-6)
  grads = jax.jit(jax.grad(loss(sharded), argnums=(0, 1, 2, 3)))(*args)
  expected = jax.grad(loss(plain), argnums=(0, 1, 2, 3))(q, k, v, log_f)
  for a, b in zip(grads, expected):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_model_under_mesh_equals_single_device():
  mesh = mesh_of((2, 1, 2), ("data", "fsdp", "tensor"))
  cfg = models.FoXConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=4, mlp_multiple_of=32,
                         block="pro", attention_impl="xla")
  model = models.get("fox").build(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, size=(4, 16)))
  params = model.init(jax.random.PRNGKey(0), tokens)
  expected = model.apply(params, tokens)
  with jax.set_mesh(mesh), nn.logical_axis_rules(DEFAULT_RULES):
    lowered = jax.jit(model.apply).lower(params, tokens)
    out = jax.jit(model.apply)(params, tokens)
  text = lowered.as_text()
  assert "manual_computation" in text or "shard_map" in text  # attention ran per shard
  np.testing.assert_allclose(out, expected, atol=1e-5)
