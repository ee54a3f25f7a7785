"""The checks and input preparation every entry point shares (``forgetting_attention``, the
sharded op, the context-parallel ring): shapes and dtypes, the window, debug value checks, and
hard cuts folded into segment ids (see ``api.py`` for why)."""

import numbers

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from .gqa import group_size
from .segments import segment_starts


def check_shapes(q, k, v, log_fgate, segment_ids):
  """Shapes and dtypes of one call; k, v may have fewer heads than q (grouped-query attention,
  gqa.py): their count must divide q's. Returns the group size G = q heads / k, v heads."""
  if q.ndim != 4:
    raise ValueError(f"forgetting_attention: q must be [batch, seq, heads, head_dim], got shape {q.shape}")
  for name, x in (("k", k), ("v", v)):
    if x.ndim != 4 or x.shape[:2] != q.shape[:2] or x.shape[3] != q.shape[3]:
      raise ValueError(f"forgetting_attention: {name} shape {x.shape} must be [batch, seq, kv_heads, head_dim] "
                       f"with q's batch, seq and head_dim {q.shape}")
  if v.shape != k.shape:
    raise ValueError(f"forgetting_attention: v shape {v.shape} must equal k shape {k.shape}")
  group = group_size(q.shape[2], k.shape[2])
  for name, x in (("k", k), ("v", v)):
    if x.dtype != q.dtype:
      raise TypeError(f"forgetting_attention: {name} dtype {x.dtype} must equal q dtype {q.dtype}")
  if not jnp.issubdtype(q.dtype, jnp.floating):
    raise TypeError(f"forgetting_attention: q, k, v must be floating point, got {q.dtype}")
  if log_fgate.shape != q.shape[:3]:
    raise ValueError(f"forgetting_attention: log_fgate must be [batch, seq, heads] = {q.shape[:3]}, "
                     f"got {log_fgate.shape}")
  if log_fgate.dtype != jnp.float32:
    raise TypeError(f"forgetting_attention: log_fgate must be float32 (got {log_fgate.dtype}); "
                    "compute the gate's log-sigmoid in float32")
  if segment_ids is not None:
    if segment_ids.shape != q.shape[:2]:
      raise ValueError(f"forgetting_attention: segment_ids must be [batch, seq] = {q.shape[:2]}, "
                       f"got {segment_ids.shape}")
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
      raise TypeError(f"forgetting_attention: segment_ids must be integers, got {segment_ids.dtype}")
  return group


def check_window(window, seq_len):
  """The window as a Python int, or None when there is none or it spans the whole sequence."""
  if window is None:
    return None
  if isinstance(window, jax.Array):  # a tracer or a device scalar: loop bounds need a static int
    raise ValueError("forgetting_attention: window must be a static Python int (it sets the "
                     f"kernels' loop bounds), got a JAX array {window!r}")
  if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
    raise ValueError(f"forgetting_attention: window must be None or an int >= 1, got {window!r}")
  return None if window >= seq_len else int(window)


def check_values(q, k, v, log_fgate):
  """Value checks for debug mode: raise eagerly, or record a checkify error under tracing."""
  checkify.check(jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(k)) & jnp.all(jnp.isfinite(v)),
                 "forgetting_attention: q, k or v holds a NaN or an infinity")
  checkify.check(jnp.all(log_fgate <= 0) & ~jnp.any(jnp.isnan(log_fgate)),
                 "forgetting_attention: log_fgate must be <= 0 (-inf allowed), found a positive or NaN value")


def prepare_segments(log_fgate, segment_ids):
  """Fold hard cuts into per-head segment ids. Returns (finite log f, int32 ids [batch, seq, heads]).

  Position t starts a new segment of head h when log f_t = -inf in that head, or when the
  caller's segment id changes between t-1 and t.
  """
  is_cut = jnp.isneginf(log_fgate)
  starts = is_cut
  if segment_ids is not None:
    starts = starts | segment_starts(segment_ids)[:, :, None]
  ids = jnp.cumsum(starts.astype(jnp.int32), axis=1)
  return jnp.where(is_cut, 0.0, log_fgate), ids
