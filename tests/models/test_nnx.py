"""A zoo model used from Flax NNX through the Linen bridge (docs/api.md)."""

import contextlib

import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import models

bridge = pytest.importorskip("flax.nnx.bridge")
from flax import nnx  # noqa: E402  (after the skip: older Flax has no nnx.bridge)


def no_eager_sharding():
  """Recent Flax shards a Variable with sharding annotations as it is created, which needs a
  mesh; lpcjax's params carry logical axis names (no mesh axes) for Linen's partitioning rules,
  so creating them outside a mesh fails unless eager sharding is off (the
  ``flax_always_shard_variable`` flag, scoped here). Older Flax has no eager sharding."""
  use = getattr(nnx, "use_eager_sharding", None)
  return use(False) if use is not None else contextlib.nullcontext()


def test_decoder_lm_through_nnx_bridge():
  fam = models.get("fox")
  cfg = fam.config_cls(vocab_size=50, d_model=32, num_layers=2, num_heads=4, mlp_multiple_of=32,
                       block="pro", attention_impl="xla")
  linen_model = fam.build(cfg)
  tokens = jnp.arange(12)[None] % 50
  with no_eager_sharding():
    model = bridge.ToNNX(linen_model, rngs=nnx.Rngs(0))
    bridge.lazy_init(model, tokens)
  logits = model(tokens)
  assert logits.shape == (1, 12, 50)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))  # the same tree as Linen's params
  np.testing.assert_allclose(logits, linen_model.apply({"params": params}, tokens), rtol=1e-6)
  grads = nnx.grad(lambda m: jnp.mean(m(tokens) ** 2))(model)
  assert np.isfinite(np.asarray(grads["layers"]["attn"]["q_proj"]["kernel"][...])).all()
