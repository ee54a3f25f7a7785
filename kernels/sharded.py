"""forgetting_attention under ``shard_map``: batch and heads sharded over a device mesh, and
optionally the sequence (context parallelism, context_parallel.py).

GSPMD cannot partition a ``pallas_call``; left alone, XLA would gather the whole batch onto
every device. Attention is independent per (batch, head), so each device simply runs the
kernel on its own shard. With ``context_axis`` the sequence is split over that mesh axis too,
and the shards attend to each other over a ring; without it a sequence-sharded input is
gathered along the sequence first.
"""

import functools

import jax
from jax.sharding import PartitionSpec as P

from .api import forgetting_attention
from .checks import check_values
from .context_parallel import ring_attention


def sharded_forgetting_attention(q, k, v, log_fgate, *, mesh, batch_axes=None, head_axes=None,
                                 context_axis=None, segment_ids=None, **kwargs):
  """Same contract as ``forgetting_attention``; ``batch_axes``/``head_axes`` name the mesh axes
  (a name, a tuple of names, or None) that the batch and head dimensions are split over, and
  ``context_axis`` (a name or None) the one the sequence is split over (its length must then be
  a multiple of twice that axis's size without a window, of the size with one).
  ``kwargs`` go to ``forgetting_attention`` (impl, block_sizes, interpret, ...). With grouped-
  query attention (k, v with fewer heads than q) the head axes split k, v too: their head count
  must be a multiple of those axes' size, and each device then holds whole groups."""
  if kwargs.pop("debug", False):  # check the global arrays: checkify cannot see into shard_map
    check_values(q, k, v, log_fgate)
  attend = forgetting_attention
  if context_axis is not None and mesh.shape[context_axis] > 1:
    attend = functools.partial(ring_attention, axis_name=context_axis, axis_size=mesh.shape[context_axis])
  else:
    context_axis = None  # a context axis of size 1 splits nothing
  qkv = P(batch_axes, context_axis, head_axes, None)
  gate = P(batch_axes, context_axis, head_axes)
  if segment_ids is None:
    fn = lambda q, k, v, f: attend(q, k, v, f, **kwargs)
    specs, args = (qkv, qkv, qkv, gate), (q, k, v, log_fgate)
  else:
    fn = lambda q, k, v, f, s: attend(q, k, v, f, segment_ids=s, **kwargs)
    specs, args = (qkv, qkv, qkv, gate, P(batch_axes, context_axis)), (q, k, v, log_fgate, segment_ids)
  # check_vma off: pallas_call carries no varying-manual-axes annotations.
  return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=qkv, check_vma=False)(*args)
