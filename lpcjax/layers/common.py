"""Small shared pieces: dtype names, initializers with logical axis names, RMSNorm, projections,
the token embedding and the parameter count."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from .configs import DTYPE_NAMES

DTYPES = dict(zip(DTYPE_NAMES, (jnp.float32, jnp.bfloat16, jnp.float16)))


def dtype_of(name):
  return DTYPES[name]


def num_params(params):
  """The number of scalars in a parameter tree."""
  return sum(int(math.prod(x.shape)) for x in jax.tree.leaves(params))


def normal_init(std, axes):
  """Normal(0, std) initializer whose param carries logical axis names for sharding."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=std), axes)


def constant_init(value, axes):
  return nn.with_logical_partitioning(nn.initializers.constant(value), axes)


class RMSNorm(nn.Module):
  """x / rms(x) * scale over the last axis, computed in float32, returned in ``dtype``.

  ``scale_shape`` defaults to the last axis; give e.g. (heads, head_dim) for per-head scales.
  """

  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  scale_axes: tuple = ("embed",)
  scale_shape: tuple | None = None

  @nn.compact
  def __call__(self, x):
    shape = self.scale_shape or (x.shape[-1],)
    scale = self.param("scale", constant_init(1.0, self.scale_axes), shape, self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * scale.astype(jnp.float32)).astype(self.dtype)


class Projection(nn.Module):
  """x [..., *in] @ kernel [*in, *out] -> [..., *out], in = the last ``in_ndim`` axes of x.

  The kernel is created in its full shape (not flattened as nn.DenseGeneral does) so that its
  logical axis names ``axes`` (one per kernel dim) stay valid under sharding rules.
  """

  out_shape: tuple
  axes: tuple
  in_ndim: int = 1
  init_std: float = 0.02
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    shape = tuple(x.shape[-self.in_ndim:]) + tuple(self.out_shape)
    kernel = self.param("kernel", normal_init(self.init_std, self.axes), shape, self.param_dtype)
    return jnp.tensordot(x.astype(self.dtype), kernel.astype(self.dtype), axes=self.in_ndim)


class TokenEmbed(nn.Embed):
  """nn.Embed whose table is gathered over its embed dimension before the lookup.

  Under FSDP the table's embed dimension is sharded over "fsdp", while activations shard their
  batch over ("data", "fsdp"). Rows looked up from the sharded table come out embed-sharded, and
  XLA can turn that into batch sharding only by rematerializing the whole activation (its
  "Involuntary full rematerialization" warning), in the backward pass too. Gathering the table
  first, as FSDP does for every other weight, avoids it; the vocabulary stays sharded.
  """

  def __call__(self, inputs):
    (table,) = self.promote_dtype(self.embedding, dtype=self.dtype, inexact=False)
    table = nn.with_logical_constraint(table, ("vocab", None))
    return jnp.take(table, inputs, axis=0)


# ----------------------------------------------------------------------------- bounded parameters


def logit(p):
  """log(p / (1 − p)), for a Python float p in (0, 1)."""
  return math.log(p / (1.0 - p))


def bounded(raw, low, high):
  """low + (high − low) σ(raw) ∈ [low, high]: an optimizer can never push it out."""
  return low + (high - low) * jax.nn.sigmoid(raw)


def bounded_init(value, low, high):
  """The logit at which ``bounded`` gives ``value`` (strictly inside (low, high))."""
  if not low < value < high:
    raise ValueError(f"init {value} must lie strictly inside ({low}, {high})")
  return logit((value - low) / (high - low))
