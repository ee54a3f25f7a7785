"""The custom_vjp every kernel backend shares: forward, residuals, and the backward's assembly.

A backend supplies its kernels (``BackendKernels``); ``differentiable(kernels)`` returns
``attention(q, k, v, log_fgate, seg, thr, static) -> o``, differentiable in q, k, v and
log_fgate. What it does the same way for every backend:

* forward: c = the backend's cumulative sum of log f (decay.py's two float32 parts, hi + lo),
  then (o, lse) from the forward kernel. Residuals: the inputs, lse, and o only where
  the backward reads the row term off it (float32 inputs; bf16/fp16 recompute it from the
  tiles, or read it off the two parts of o of a backend's ``forward_two_part``: row_term.py);
* backward: c again (cheaper than keeping it), the row term, the backward kernels' dq, dk, dv
  and dc_j = -sum_i dS_ij, then d log f = reverse cumsum of dc along the sequence (compensated,
  decay.reverse_cumsum), since c_t = sum_{u <= t} log f_u. Segment ids and the pruning threshold get no gradient (the
  threshold only picks which tiles to skip: piecewise constant).

``static`` is a hashable tuple of the backend's compile-time options (scale, tiles, window,
...), passed to each of its kernels as trailing arguments.
"""

import functools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from . import decay, row_term


class BackendKernels(NamedTuple):
  """A backend's pieces. Layouts are the backend's own; ``seq_axis`` is the sequence axis of
  its log f / c / dc arrays."""

  cumsum: Callable  # log_fgate -> c (a decay.TwoFloat)
  forward: Callable  # (q, k, v, c, seg, thr, *static) -> (o, lse)
  row_term: Callable  # (q, k, v, c, seg, thr, do, lse, *static) -> delta, recomputed from tiles
  row_term_from_output: Callable  # (o, do) -> delta
  backward: Callable  # (q, k, v, c, seg, thr, do, lse, delta, *static) -> (dq, dk, dv, dc)
  seq_axis: int
  # (q, k, v, c, seg, thr, *static) -> (o, o_lo, lse): the forward run for a gradient, whose o
  # + o_lo (float32) is the output with the product of V and P's rounding residual included,
  # so that delta = rowsum((o + o_lo) dO) is the backward's sum_j P_ij dP_ij (row_term.py)
  forward_two_part: Optional[Callable] = None


def differentiable(kernels):
  """``attention(q, k, v, log_fgate, seg, thr, static) -> o`` with the shared custom_vjp."""

  @functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
  def attention(q, k, v, log_fgate, seg, thr, static):  # outside a gradient: the forward kernel alone
    return kernels.forward(q, k, v, kernels.cumsum(log_fgate), seg, thr, *static)[0]

  def forward(q, k, v, log_fgate, seg, thr, static):
    args = (q, k, v, kernels.cumsum(log_fgate), seg, thr, *static)
    if row_term.recomputes(q.dtype) and kernels.forward_two_part is not None:
      o, o_lo, lse = kernels.forward_two_part(*args)
      kept = (o, o_lo)  # delta is read off o's two parts
    else:
      o, lse = kernels.forward(*args)
      kept = None if row_term.recomputes(q.dtype) else (o,)  # o is a residual only where delta reads it
    return o, (q, k, v, log_fgate, seg, thr, kept, lse)

  def backward(static, residuals, do):
    q, k, v, log_fgate, seg, thr, kept, lse = residuals
    c, do = kernels.cumsum(log_fgate), do.astype(q.dtype)
    if kept is None:  # bf16/fp16: recomputed from the tiles, see row_term.py
      delta = kernels.row_term(q, k, v, c, seg, thr, do, lse, *static)
    else:
      delta = kernels.row_term_from_output(sum(part.astype(jnp.float32) for part in kept), do)
    dq, dk, dv, dc = kernels.backward(q, k, v, c, seg, thr, do, lse, delta, *static)
    return dq, dk, dv, decay.reverse_cumsum(dc, axis=kernels.seq_axis), None, None

  attention.defvjp(forward, backward)
  return attention
