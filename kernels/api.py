"""``forgetting_attention``: the public entry point, input checks and backend dispatch.

Forgetting attention (Lin et al., "Forgetting Transformer", ICLR 2025) is causal softmax
attention whose logits carry a data-dependent decay bias:

    o_i = sum_{j <= i} softmax_j(scale * q_i . k_j + c_i - c_j) v_j,   c_t = sum_{u <= t} log f_u.

Every backend receives the same prepared inputs:

* Hard cuts. ``log f_t = -inf`` zeroes every weight across position t, which in cumsum form
  would give (-inf) - (-inf) = NaN. A cut is therefore turned into a segment boundary (exactly
  the same attention pattern) and its log f replaced by 0. Its gradient is 0, which is also the
  true derivative: exp(-inf + d) = 0 for any finite d.
* Segments. ``segment_ids`` mark packed documents; a position attends only to earlier positions
  in the same contiguous run of one segment id, so neither attention nor decay crosses a
  document boundary.
* Window. ``window=w`` (sliding-window attention) keeps keys j with i - w < j <= i only; it
  is a static int because the blockwise backends derive their loop bounds from it, skipping
  the tiles wholly outside the band. A window covering the whole sequence is dropped here, so
  it runs exactly the unwindowed code.
"""

import numbers

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from .pruning import skip_threshold
from .pallas_gpu import SUPPORTED_HEAD_DIMS, on_gpu, pallas_attention
from . import pallas_tpu
from .reference import reference_attention
from .segments import segment_starts
from .triton_backend import triton_attention
from .xla_blockwise import xla_attention


# name -> (function, supported head dims or None for any)
_BACKENDS = {
    "reference": (reference_attention, None),
    "xla": (xla_attention, None),
    "pallas": (pallas_attention, SUPPORTED_HEAD_DIMS),
    "pallas_tpu": (pallas_tpu.pallas_tpu_attention, pallas_tpu.SUPPORTED_HEAD_DIMS),
    "triton": (triton_attention, SUPPORTED_HEAD_DIMS),  # jax-triton: Python >= 3.12, GPU only
}


def register_backend(name, fn, head_dims=None):
  """Add a backend: ``fn(q, k, v, log_fgate, segment_ids, sm_scale, block_sizes, interpret,
  prune_threshold=None, window=None)`` on prepared inputs (see ``prepare_segments``). The two
  keywords are passed only when set, so a backend without pruning or windows need not take them."""
  _BACKENDS[name] = (fn, None if head_dims is None else tuple(head_dims))


def available_impls():
  return ("auto",) + tuple(_BACKENDS)


def _resolve_impl(impl, head_dim):
  if impl == "auto":
    if on_gpu() and "pallas" in _BACKENDS and head_dim in (_BACKENDS["pallas"][1] or (head_dim,)):
      return "pallas"
    if pallas_tpu.on_tpu() and head_dim in _BACKENDS["pallas_tpu"][1]:
      return "pallas_tpu"
    return "xla"
  if impl not in _BACKENDS:
    raise ValueError(f"forgetting_attention: unknown impl {impl!r}; choose one of {available_impls()}")
  supported = _BACKENDS[impl][1]
  if supported is not None and head_dim not in supported:
    raise ValueError(f"forgetting_attention: impl={impl!r} supports head_dim in {supported}, "
                     f"got {head_dim}")
  return impl


def _check_shapes(q, k, v, log_fgate, segment_ids):
  if q.ndim != 4:
    raise ValueError(f"forgetting_attention: q must be [batch, seq, heads, head_dim], got shape {q.shape}")
  for name, x in (("k", k), ("v", v)):
    if x.shape != q.shape:
      raise ValueError(f"forgetting_attention: {name} shape {x.shape} must equal q shape {q.shape}")
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


def _check_window(window, seq_len):
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


def forgetting_attention(q, k, v, log_fgate, *, segment_ids=None, sm_scale=None, impl="auto",
                         block_sizes=None, interpret=False, debug=False, prune_epsilon=None,
                         window=None):
  """Causal softmax attention with a forget gate.

  Args:
    q, k, v: [batch, seq, heads, head_dim], one floating dtype (bf16, fp16 or fp32).
    log_fgate: [batch, seq, heads] float32, log of the forget gate f_t in (0, 1]; 0 means "no
      decay" (plain causal attention) and -inf is a hard cut: nothing before t is visible from t on.
    segment_ids: optional [batch, seq] ints; no attention and no decay across a change of id.
    sm_scale: logit scale, default 1 / sqrt(head_dim).
    impl: "reference" (materialized, O(T^2), ground truth), "xla" (blockwise, O(T) memory),
      "pallas"/"triton" when registered, "pallas_tpu" (docs/kernels_tpu.md), or "auto" (the
      GPU kernel on GPU, the TPU kernel on TPU, else "xla").
    block_sizes: ``BlockSizes`` for the blockwise backends (default: each backend's own).
    interpret: run Pallas kernels in interpret mode (CPU testing).
    prune_epsilon: skip tiles whose decay bounds their total softmax weight per row below this
      (``lpcjax.kernels.pruning``; e.g. e^-10). Off (None, exact) by default. Each output then
      differs from the exact one by less than 2 * prune_epsilon * max|v|. "reference" ignores it.
    window: None (full causal attention) or a static int w >= 1: sliding-window attention,
      query i sees only keys j with i - w < j <= i (on top of segments and the decay). The
      blockwise backends skip the tiles outside the band, forward and backward. w >= seq_len
      is the same as None.
    debug: also check values (finite q/k/v, log f <= 0). Outside ``jit`` a failure raises at once;
      under ``jit`` wrap the caller with ``jax.experimental.checkify.checkify`` to surface it.

  Returns:
    o: [batch, seq, heads, head_dim] in q.dtype. Differentiable in q, k, v and log_fgate.
  """
  _check_shapes(q, k, v, log_fgate, segment_ids)
  name = _resolve_impl(impl, q.shape[-1])
  if debug:
    check_values(q, k, v, log_fgate)
  if sm_scale is None:
    sm_scale = q.shape[-1] ** -0.5
  if prune_epsilon is not None and not 0 < prune_epsilon < 1:
    raise ValueError(f"forgetting_attention: prune_epsilon must be in (0, 1), got {prune_epsilon}")
  window = _check_window(window, q.shape[1])
  log_fgate, ids = prepare_segments(log_fgate, segment_ids)
  fn = _BACKENDS[name][0]
  options = {} if window is None else {"window": window}
  if prune_epsilon is not None and name != "reference":
    options["prune_threshold"] = lax.stop_gradient(skip_threshold(q, k, sm_scale, prune_epsilon))
  return fn(q, k, v, log_fgate, ids, sm_scale, block_sizes, interpret, **options)
