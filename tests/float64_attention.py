"""Forgetting attention and its four gradients in numpy float64, blockwise: the ground truth of
the long-context precision tests (test_decay_precision.py) and of benchmarks/decay_precision.py.

Independent of lpcjax: c is numpy's float64 cumsum of the float32 log f, and the gradients are
the textbook formulas (dS = P (dP - delta), dc = row sums - column sums of dS), not a reverse
pass of any backend. Memory stays at a few [block, T] float64 arrays per head.
"""

import numpy as np


def forgetting_attention_float64(q, k, v, log_f, do, segment_ids=None, window=None, block=512):
  """o, dq, dk, dv, d log f (float64) of o = attention(q, k, v, log f) and loss sum(o * do).

  q, k, v, do: [batch, T, heads, D]; log_f: [batch, T, heads] (finite); segment_ids: [batch, T]
  or None; window: None or keys i - window < j <= i only."""
  q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
  log_f = np.asarray(log_f, np.float64)
  batch, seq_len, heads, head_dim = q.shape
  scale = head_dim ** -0.5
  o, dq, dk, dv = (np.zeros_like(q) for _ in range(4))
  dc = np.zeros_like(log_f)
  positions = np.arange(seq_len)
  for b in range(batch):
    ids = np.zeros(seq_len, np.int64) if segment_ids is None else np.asarray(segment_ids[b])
    for h in range(heads):
      c = np.cumsum(log_f[b, :, h])
      for start in range(0, seq_len, block):
        rows = slice(start, min(start + block, seq_len))
        end = rows.stop  # keys after the block's last row are never seen
        i, j = positions[rows, None], positions[None, :end]
        visible = (j <= i) & (ids[rows, None] == ids[None, :end])
        if window is not None:
          visible &= i - j < window
        s = q[b, rows, h] @ k[b, :end, h].T * scale
        s += c[rows, None] - c[None, :end]
        s[~visible] = -np.inf
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s, out=s)
        p /= p.sum(axis=1, keepdims=True)
        o[b, rows, h] = p @ v[b, :end, h]
        dp = do[b, rows, h] @ v[b, :end, h].T
        dp -= np.einsum("ij,ij->i", p, dp)[:, None]
        ds = np.multiply(p, dp, out=dp)
        dq[b, rows, h] = ds @ k[b, :end, h] * scale
        dk[b, :end, h] += ds.T @ q[b, rows, h] * scale
        dv[b, :end, h] += p.T @ do[b, rows, h]
        dc[b, rows, h] += ds.sum(axis=1)  # c_i enters row i with +, c_j column j with -
        dc[b, :end, h] -= ds.sum(axis=0)
  dlog_f = np.cumsum(dc[:, ::-1], axis=1)[:, ::-1]  # c_t = sum_{u <= t} log f_u
  return o, dq, dk, dv, dlog_f


def grouped_forgetting_attention_float64(q, k, v, log_f, do, segment_ids=None, window=None):
  """The same for k, v with fewer heads than q (grouped-query: query head h reads head h // G):
  K/V repeated to the query heads, their gradients summed back over each group."""
  group = q.shape[2] // k.shape[2]
  repeat = lambda x: np.repeat(x, group, axis=2)
  o, dq, dk, dv, dlog_f = forgetting_attention_float64(q, repeat(k), repeat(v), log_f, do, segment_ids, window)
  fold = lambda dx: dx.reshape(*dx.shape[:2], -1, group, dx.shape[-1]).sum(axis=3)
  return o, dq, fold(dk), fold(dv), dlog_f


def long_context_inputs(seed, batch, seq_len, heads, head_dim, log_f_range=(-4.0, -1.0),
                        c_offset=0.0, dtype=np.float32):
  """q, k, v, dO normal; log f uniform in ``log_f_range``; log f at position 0 lowered by
  ``c_offset``, which shifts every c by it and changes no weight (position 0 is no key's
  decay: c_i - c_j never contains log f_0), so the exact outputs stay the same."""
  rng = np.random.default_rng(seed)
  q, k, v, do = (rng.normal(size=(batch, seq_len, heads, head_dim)).astype(dtype)
                 for _ in range(4))
  log_f = rng.uniform(*log_f_range, size=(batch, seq_len, heads))
  log_f[:, 0] -= c_offset
  return q, k, v, log_f.astype(np.float32), do


def relative_errors(results, truth):
  """max |a - b| / max |b| of each pair, in float64."""
  return [float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))
          for a, b in zip(results, truth)]
