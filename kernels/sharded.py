"""forgetting_attention under ``shard_map``: batch and heads sharded over a device mesh.

GSPMD cannot partition a ``pallas_call``; left alone, XLA would gather the whole batch onto
every device. Attention is independent per (batch, head), so each device simply runs the
kernel on its own shard. The sequence and head_dim axes must be unsharded inside the op (no
context parallelism): a sequence-sharded input is gathered along the sequence first.
"""

import jax
from jax.sharding import PartitionSpec as P

from .api import check_values, forgetting_attention


def sharded_forgetting_attention(q, k, v, log_fgate, *, mesh, batch_axes=None, head_axes=None,
                                 segment_ids=None, **kwargs):
  """Same contract as ``forgetting_attention``; ``batch_axes``/``head_axes`` name the mesh axes
  (a name, a tuple of names, or None) that the batch and head dimensions are split over.
  ``kwargs`` go to ``forgetting_attention`` (impl, block_sizes, interpret, ...)."""
  if kwargs.pop("debug", False):  # check the global arrays: checkify cannot see into shard_map
    check_values(q, k, v, log_fgate)
  qkv = P(batch_axes, None, head_axes, None)
  gate = P(batch_axes, None, head_axes)
  if segment_ids is None:
    fn = lambda q, k, v, f: forgetting_attention(q, k, v, f, **kwargs)
    specs, args = (qkv, qkv, qkv, gate), (q, k, v, log_fgate)
  else:
    fn = lambda q, k, v, f, s: forgetting_attention(q, k, v, f, segment_ids=s, **kwargs)
    specs, args = (qkv, qkv, qkv, gate, P(batch_axes, None)), (q, k, v, log_fgate, segment_ids)
  # check_vma off: pallas_call carries no varying-manual-axes annotations.
  return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=qkv, check_vma=False)(*args)
