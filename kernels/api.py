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

from jax import lax

# Each built-in backend's file registers it in the table (backends.py): importing them here
# fills the table before anything reads it through this module or the package.
from . import mosaic_gpu, pallas_gpu, pallas_tpu, reference, triton_backend, xla_blockwise  # noqa: F401
from .backends import (Backend, PairKernels, available_impls, ordered_backends, platform_problem,  # noqa: F401
                       register_backend, resolve, source_of, unsupported)
from .checks import check_shapes, check_values, check_window, prepare_segments
from .pruning import skip_threshold

__all__ = ["available_impls", "check_values", "forgetting_attention", "prepare_segments", "register_backend"]


def forgetting_attention(q, k, v, log_fgate, *, segment_ids=None, sm_scale=None, impl="auto",
                         block_sizes=None, interpret=False, debug=False, prune_epsilon=None,
                         window=None):
  """Causal softmax attention with a forget gate.

  Args:
    q: [batch, seq, heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim], one floating
      dtype (bf16, fp16 or fp32). kv_heads < heads is grouped-query attention (gqa.py): kv_heads
      must divide heads and query head h reads key/value head h // (heads / kv_heads); no
      backend repeats K/V in memory.
    log_fgate: [batch, seq, heads] float32 (per query head), log of the forget gate f_t in (0, 1]; 0 means "no
      decay" (plain causal attention) and -inf is a hard cut: nothing before t is visible from t on.
    segment_ids: optional [batch, seq] ints; no attention and no decay across a change of id.
    sm_scale: logit scale, default 1 / sqrt(head_dim).
    impl: a registered backend (``backends.py``): "reference" (materialized, O(T^2), ground
      truth), "xla" (blockwise, O(T) memory), "pallas", "triton", "pallas_tpu"
      (docs/kernels_tpu.md); or "auto": the backend of highest priority that runs natively
      here and supports the call (the GPU kernel on GPU, the TPU kernel on TPU), else "xla".
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
    o: [batch, seq, heads, head_dim] in q.dtype. Differentiable in q, k, v and log_fgate (dk, dv
    summed over each group's query heads).
  """
  group = check_shapes(q, k, v, log_fgate, segment_ids)
  window = check_window(window, q.shape[1])
  backend = resolve(impl, q.shape[-1], q.dtype, window, kv_group=group)
  if debug:
    check_values(q, k, v, log_fgate)
  if sm_scale is None:
    sm_scale = q.shape[-1] ** -0.5
  if prune_epsilon is not None and not 0 < prune_epsilon < 1:
    raise ValueError(f"forgetting_attention: prune_epsilon must be in (0, 1), got {prune_epsilon}")
  log_fgate, ids = prepare_segments(log_fgate, segment_ids)
  options = {} if window is None else {"window": window}
  if prune_epsilon is not None and backend.pruning:
    options["prune_threshold"] = lax.stop_gradient(skip_threshold(q, k, sm_scale, prune_epsilon))
  return backend.attention(q, k, v, log_fgate, ids, sm_scale, block_sizes, interpret, **options)
