"""Logical axis names, their default mapping to mesh axes, and the mesh the model runs under.

Params and activations are annotated with logical names (``nn.with_logical_partitioning`` /
``nn.with_logical_constraint``); a rules table maps them to the mesh axes
("data", "fsdp", "context", "tensor"). Without rules the annotations are no-ops.

The "context" axis splits the sequence (``activation_length``, mapped to it by the trainer's
``rules_from_config``): activations, tokens and the loss are sharded along it, GSPMD
partitions every position-wise op, the two layers that mix neighbouring positions call
``shift_along_sequence`` (the Pro block's KV-shift) and ``cummax_along_sequence`` (RoPE
positions within packed documents), and the attention runs context-parallel over a ring
(``kernels/context_parallel.py``).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from lpcjax.config import ConfigError

MESH_AXES = ("data", "fsdp", "context", "tensor")

# logical name -> mesh axes. Params: FSDP over "embed", tensor parallel over heads and mlp.
DEFAULT_RULES = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),  # the trainer maps it to "context" (rules_from_config)
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_head_dim", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
)


def active_mesh():
  """The mesh set with ``jax.set_mesh(mesh)`` (or ``jax.sharding.use_mesh``), or None."""
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh is None or mesh.empty else mesh


def _present(axes, mesh):
  """Keep only the mesh axes that exist in ``mesh`` (rules may name axes a mesh lacks)."""
  if axes is None:
    return None
  names = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if a in mesh.axis_names)
  return names or None


def _ways(axes, mesh):
  return 1 if axes is None else int(np.prod([mesh.shape[a] for a in axes]))


def attention_mesh_axes(batch, heads):
  """(mesh, batch_axes, head_axes, context_axis) for running attention on [batch, seq, heads,
  ...] under shard_map, or None when no mesh is active, the current rules shard none of batch,
  sequence and heads, or the batch or head sizes do not divide (e.g. the batch of 1 used at
  init): GSPMD handles those. ``context_axis`` is the one mesh axis of size > 1 that
  ``activation_length`` maps to, or None."""
  mesh = active_mesh()
  if mesh is None:
    return None
  spec = nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
  batch_axes, head_axes = _present(spec[0], mesh), _present(spec[1], mesh)
  context_axis = _context_axis(mesh)
  if batch_axes is None and head_axes is None and context_axis is None:
    return None
  if batch % _ways(batch_axes, mesh) or heads % _ways(head_axes, mesh):
    return None
  return mesh, batch_axes, head_axes, context_axis


def _context_axis(mesh):
  """The mesh axis of size > 1 that ``activation_length`` maps to, or None."""
  axes = _present(nn.logical_to_mesh_axes(("activation_length",))[0], mesh)
  context = tuple(a for a in (axes or ()) if mesh.shape[a] > 1)
  if len(context) > 1:
    raise ConfigError(f"train.logical_rules: activation_length may map to one mesh axis of size > 1, "
                      f"got {' x '.join(context)}")
  return context[0] if context else None


def _sequence_split(x, logical_axes):
  """(mesh, context axis, x's mesh axes) when x's second dimension is split over a context
  axis and every dimension divides evenly; None otherwise."""
  mesh = active_mesh()
  context = None if mesh is None else _context_axis(mesh)
  if context is None:
    return None
  spec = [_present(axes, mesh) for axes in nn.logical_to_mesh_axes(logical_axes)]
  if spec[1] != (context,) or any(size % _ways(axes, mesh) for size, axes in zip(x.shape, spec)):
    return None  # not split along the sequence here, or not evenly (e.g. one token)
  return mesh, context, spec


def cummax_along_sequence(x, logical_axes):
  """``lax.cummax(x, axis=1)`` for x [batch, seq, ...] (``logical_axes`` names its dimensions).
  With the sequence split over a context axis, each shard starts from the largest value of the
  shards before it (one all-gather of each shard's last running max), where GSPMD would gather
  the whole sequence."""
  split = _sequence_split(x, logical_axes)
  if split is None:
    return lax.cummax(x, axis=1)
  mesh, context, spec = split

  def local(x):
    running = lax.cummax(x, axis=1)
    shard_max = lax.all_gather(running[:, -1], context)  # [shards, batch, ...]
    earlier = jnp.arange(shard_max.shape[0]) < lax.axis_index(context)
    earlier = earlier.reshape((-1,) + (1,) * (shard_max.ndim - 1))
    lowest = jnp.iinfo(x.dtype).min if jnp.issubdtype(x.dtype, jnp.integer) else -jnp.inf
    floor = jnp.max(jnp.where(earlier, shard_max, lowest), axis=0)
    return jnp.maximum(running, floor[:, None])

  return jax.shard_map(local, mesh=mesh, in_specs=P(*spec), out_specs=P(*spec), check_vma=False)(x)


def shift_along_sequence(x, first, logical_axes):
  """x [batch, seq, ...] moved one position later, ``first`` [batch, 1, ...] in front: position
  t holds x[t - 1] (a token shift). ``logical_axes`` names x's dimensions.

  With the sequence split over a context axis, each shard takes its predecessor's last position
  by one ppermute (the first shard takes ``first``); left to GSPMD, the concatenation would move
  every shard whole (an all-to-all)."""
  plain = lambda x, first: jnp.concatenate([first, x[:, :-1]], axis=1)
  split = _sequence_split(x, logical_axes)
  if split is None:
    return plain(x, first)
  mesh, context, spec = split
  ways = mesh.shape[context]

  def local(x, first):
    last = lax.ppermute(x[:, -1:], context, [(i, i + 1) for i in range(ways - 1)])
    return plain(x, jnp.where(lax.axis_index(context) == 0, first, last))

  front = P(spec[0], None, *spec[2:])
  return jax.shard_map(local, mesh=mesh, in_specs=(P(*spec), front), out_specs=P(*spec), check_vma=False)(x, first)


def rules_from_config(train_config):
  """The trainer's rules: DEFAULT_RULES with the sequence on the "context" axis, which every mesh
  of ``make_mesh`` has (size 1 unless ``train.mesh_context`` > 1; a mesh of your own may lack
  it, so DEFAULT_RULES leave the sequence unsplit: add ("activation_length", "context") to
  split it), then the config's ``logical_rules`` overrides."""
  rules = {**dict(DEFAULT_RULES), "activation_length": ("context",)}
  for rule in train_config.logical_rules:
    name, axes = rule.split("=")
    rules[name] = None if axes.lower() == "none" else tuple(axes.split("+"))
  return tuple(rules.items())


def context_ways(mesh):
  """How many ways the mesh splits the sequence (1 without a "context" axis)."""
  return mesh.shape.get("context", 1)


def make_mesh(train_config, devices=None):
  """The ("data", "fsdp", "context", "tensor") mesh of the config; -1 takes the devices left over."""
  devices = jax.devices() if devices is None else devices
  shape = [getattr(train_config, f"mesh_{axis}") for axis in MESH_AXES]
  known = 1
  for size in shape:
    known *= size if size != -1 else 1
  # the field to blame: the last axis given a size of its own (the one the user set), else data
  sized = [f"train.mesh_{axis}" for axis, size in zip(MESH_AXES, shape) if size not in (1, -1)]
  field = sized[-1] if sized else "train.mesh_data"
  if -1 in shape:
    rest = f"train.mesh_{MESH_AXES[shape.index(-1)]}"
    if len(devices) % known:
      raise ConfigError(f"{field}: the mesh axes of fixed size take {known} devices, which does not divide the "
                        f"{len(devices)} devices found ({rest}=-1 takes the rest)")
    shape[shape.index(-1)] = len(devices) // known
  if int(np.prod(shape)) != len(devices):
    raise ConfigError(f"{field}: {' x '.join(MESH_AXES)} = {' x '.join(map(str, shape))} needs "
                      f"{int(np.prod(shape))} devices, found {len(devices)}")
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=auto, devices=devices)


def check_divisible(tree, shardings):
  """A one-line ConfigError naming the mesh field and the first array of ``tree`` (abstract
  arrays) whose sharded dimension the mesh axes do not divide (JAX needs them to)."""
  for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(tree), jax.tree.leaves(shardings)):
    for dim, axes in enumerate(sharding.spec):
      axes = (axes,) if isinstance(axes, str) else (axes or ())
      ways = _ways(axes, sharding.mesh) if axes else 1
      if leaf.shape[dim] % ways:
        raise ConfigError(
            f"train.mesh_{axes[-1]}: {ways}-way sharding over {' x '.join(axes)} does not divide "
            f"{jax.tree_util.keystr(path)} (dimension {dim} has size {leaf.shape[dim]}); choose mesh sizes "
            f"that divide it, or change train.logical_rules")
