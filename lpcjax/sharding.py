"""Logical axis names, their default mapping to mesh axes, and the mesh the model runs under.

Params and activations are annotated with logical names (``nn.with_logical_partitioning`` /
``nn.with_logical_constraint``); a rules table maps them to the mesh axes
("data", "fsdp", "tensor"). Without rules the annotations are no-ops.
"""

import flax.linen as nn
import jax

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


def attention_mesh_axes():
  """(mesh, batch_axes, head_axes) for running attention under shard_map, or None when no mesh
  is active or the current rules shard neither batch nor heads."""
  mesh = active_mesh()
  if mesh is None:
    return None
  spec = nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
  batch_axes, head_axes = _present(spec[0], mesh), _present(spec[1], mesh)
  if batch_axes is None and head_axes is None:
    return None
  return mesh, batch_axes, head_axes
