"""The backward pass's row term delta_i = sum_j P_ij dP_ij, and why low-precision inputs
recompute it instead of reading it off the output.

Every blockwise backward forms dS_ij = P_ij (dP_ij - delta_i), whose rows then sum to zero.
FlashAttention and the official FoX Triton kernel take delta_i = rowsum(o_i * dO_i), which
equals sum_j P_ij dP_ij only when o was computed from the same P in the same precision. With
bf16/fp16 inputs it was not: the forward multiplies P rounded to bf16 by V and returns o rounded
to bf16, so each delta_i is off by rowsum(error of o_i * dO_i). dq, dk and dv barely notice, but
d log f does: d log f_t = -sum_{j >= t} sum_i dS_ij sums dS over the whole sequence, where the
row sums should cancel exactly and each row's error survives instead (up to a few percent of the
largest entry in bf16, benchmarks/bf16_grad.py). Keeping o in float32 as a residual removes only
the rounding of o, not that of P in the forward product (P is rounded to bf16 to multiply V),
and left a quarter to a half of the error when tried.

So with bf16/fp16 inputs the backward recomputes delta_i = sum_j P_ij dP_ij in float32 from the
tiles themselves (one sweep over the key blocks of each query block, the dq sweep's first two
matrix products: q k^T and dO v^T), before the dq and dk/dv sweeps. The rows of dS then sum to
zero up to float32 rounding, and the output is no longer a residual: the residual memory drops
by o (2 bytes per element), the backward does two more tile products (9 instead of 7). Float32
inputs keep rowsum(o * dO), which is already consistent there.
"""

import jax.numpy as jnp

# False restores the row term from the rounded output for every dtype (the official kernel's),
# for measurements only (benchmarks/bf16_grad.py). Read when a function is traced.
RECOMPUTE = True


def recomputes(dtype):
  """Whether the backward recomputes delta for inputs of ``dtype`` (else: rowsum(o * dO))."""
  return RECOMPUTE and jnp.dtype(dtype) != jnp.float32


def from_output(o, do, axis=-1):
  """delta = rowsum(o * dO) in float32 over ``axis``."""
  return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=axis)
