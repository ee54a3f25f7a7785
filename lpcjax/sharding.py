"""Logical axis names, their default mapping to mesh axes, and the mesh the model runs under.

Params and activations are annotated with logical names (``nn.with_logical_partitioning`` /
``nn.with_logical_constraint``); a rules table maps them to the mesh axes
("data", "fsdp", "tensor"). Without rules the annotations are no-ops.
"""

import flax.linen as nn
import jax
import numpy as np

from lpcjax.config import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axes. Params: FSDP over "embed", tensor parallel over heads and mlp.
DEFAULT_RULES = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
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
  """(mesh, batch_axes, head_axes) for running attention on [batch, ..., heads, ...] under
  shard_map, or None when no mesh is active, the current rules shard neither batch nor heads,
  or the sizes do not divide (e.g. the batch of 1 used at init): GSPMD handles those."""
  mesh = active_mesh()
  if mesh is None:
    return None
  spec = nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
  batch_axes, head_axes = _present(spec[0], mesh), _present(spec[1], mesh)
  if batch_axes is None and head_axes is None:
    return None
  if batch % _ways(batch_axes, mesh) or heads % _ways(head_axes, mesh):
    return None
  return mesh, batch_axes, head_axes


def rules_from_config(train_config):
  """DEFAULT_RULES with the config's ``logical_rules`` overrides applied."""
  rules = dict(DEFAULT_RULES)
  for rule in train_config.logical_rules:
    name, axes = rule.split("=")
    rules[name] = None if axes.lower() == "none" else tuple(axes.split("+"))
  return tuple(rules.items())


def make_mesh(train_config, devices=None):
  """The ("data", "fsdp", "tensor") mesh of the config; -1 takes the devices left over."""
  devices = jax.devices() if devices is None else devices
  shape = [train_config.mesh_data, train_config.mesh_fsdp, train_config.mesh_tensor]
  known = 1
  for size in shape:
    known *= size if size != -1 else 1
  if -1 in shape:
    field = f"train.mesh_{MESH_AXES[shape.index(-1)]}"
    if len(devices) % known:
      raise ConfigError(f"{field}: the other mesh axes take {known} devices, which does not divide the "
                        f"{len(devices)} devices found")
    shape[shape.index(-1)] = len(devices) // known
  if shape[0] * shape[1] * shape[2] != len(devices):
    raise ConfigError(f"train.mesh_data: data x fsdp x tensor = {' x '.join(map(str, shape))} needs "
                      f"{shape[0] * shape[1] * shape[2]} devices, found {len(devices)}")
  auto = (jax.sharding.AxisType.Auto,) * 3
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
