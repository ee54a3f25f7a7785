"""The inputs and the row shapes shared by the attention benchmarks, so that lpcjax's kernels
(attention.py, JAX) and the PyTorch peers (attention_peers.py) time the same arrays: numpy
float32 q, k, v, dO (normal) and log f, made from one seed.

Gates: by default log f = log u, u uniform in [0.9, 1) (a typical token decays by 1/e in about
20 steps). With a timescale tau: log f = log sigmoid(b + 0.5 * noise), b set so that
sigmoid(b) = exp(-1/tau), the gates of the pruning rows (benchmarks/pruning.py).
"""

import functools
import math

import numpy as np


def causal_flops(batch, heads, seq_len, head_dim):
  """(forward, forward + backward) FLOPs of causal attention: the two matmuls of the forward on
  half the [T, T] scores, the backward 2.5x the forward (five matmuls to two)."""
  forward = 0.5 * 4 * batch * heads * seq_len * seq_len * head_dim
  return forward, forward * 3.5


def row_shape(seq_len, head_dim, batch_tokens, model_dim):
  """(batch, heads) of a row: every row holds about batch_tokens tokens of model_dim channels."""
  return max(1, batch_tokens // seq_len), max(1, model_dim // head_dim)


def timescale_log_f(rng, shape, tau):
  """log f whose typical gate decays by 1/e over tau steps, float32."""
  p = math.exp(-1 / tau)
  bias = math.log(p) - math.log1p(-p)
  x = bias + 0.5 * rng.normal(size=shape)
  return (-np.logaddexp(0.0, -x)).astype(np.float32)  # log sigmoid, without overflow


@functools.lru_cache(maxsize=1)
def attention_inputs(batch, seq_len, heads, head_dim, gate_timescale=None, seed=0):
  """q, k, v, do: [batch, seq_len, heads, head_dim]; log_f: [batch, seq_len, heads]; numpy float32.
  The last call's arrays are kept (a row's candidates share them: 1 GiB at T = 16k, several
  seconds to draw); do not modify them."""
  rng = np.random.default_rng(seed)
  shape = (batch, seq_len, heads, head_dim)
  q, k, v, do = (rng.standard_normal(size=shape, dtype=np.float32) for _ in range(4))
  if gate_timescale is None:
    log_f = np.log(rng.uniform(0.9, 1.0, size=shape[:3])).astype(np.float32)
  else:
    log_f = timescale_log_f(rng, shape[:3], gate_timescale)
  return {"q": q, "k": k, "v": v, "do": do, "log_f": log_f}


def row_line(row):
  """One printed table line of a timed (or skipped) row."""
  label = row["candidate"] + (f" tau={row['gate_timescale']:g}" if row.get("gate_timescale") else "")
  head = f"{row['head_dim']:>4} {row['seq_len']:>6} {label:>28}"
  if "forward_ms" not in row:
    return f"{head}   {row.get('skipped') or row.get('error')}"
  memory = row.get("memory_bytes")
  memory = f"{memory / 2**20:>9.1f}" if memory is not None else f"{'-':>9}"
  return (f"{head} {row['forward_ms']:>9.2f} {row['forward_tflops']:>9.2f} {row['forward_backward_ms']:>9.2f} "
          f"{row['forward_backward_tflops']:>9.2f} {memory}"
          + (f"  skips {row['skipped_tile_fraction']:.0%} of tiles" if "skipped_tile_fraction" in row else ""))


TABLE_HEADER = (f"{'D':>4} {'T':>6} {'candidate':>28} {'fwd ms':>9} {'fwd TF/s':>9} {'f+b ms':>9} "
                f"{'f+b TF/s':>9} {'mem MiB':>9}")


def timing_figures(batch, heads, seq_len, head_dim, forward_s, forward_backward_s):
  """The timed row's figures: milliseconds and causal TFLOP/s."""
  flops_fwd, flops_total = causal_flops(batch, heads, seq_len, head_dim)
  return {"forward_ms": forward_s * 1e3, "forward_backward_ms": forward_backward_s * 1e3,
          "forward_tflops": flops_fwd / forward_s / 1e12,
          "forward_backward_tflops": flops_total / forward_backward_s / 1e12}
