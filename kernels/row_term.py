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

A backend may instead read delta off its output in two parts (``forward_two_part`` of vjp.py;
impl="mosaic_gpu", version 2, which then needs no row-term kernel): its forward, when run for a
gradient, multiplies V by P rounded to the inputs' dtype and by P's rounding residual (rounded
too: a third matrix product per tile; wgmma takes both operands in one dtype), and writes o and
o_lo = o32 - o rounded, whose sum is P V to about 2^-18 relative in bf16 (each of the two
roundings is at most 2^-16 of its element; in fp16 the residual of a weight below 2^-3 is
subnormal, an absolute error below 2^-25 of the row's largest weight, 1). o_lo is bf16 for fp16
inputs too, whose exponent range would let it underflow where |o| is small. delta_i =
dO_i . (o_i + o_lo_i) is then off by about that much per row, which d log f would still sum
over the sequence; so that backend's dQ kernel also sums each row of dS and adds it to dc
(dc_t = sum_j dS_tj - sum_i dS_it: the row half is zero up to delta's error, and with it each
row's error stays near its row instead of accumulating).
d log f, bf16, T = 512, f in [0.3, 1), against float64 (tests/kernels/test_mosaic_gpu.py, in
JAX's Mosaic GPU interpreter): 9.4e-7 with the recomputed row term, 4.6e-6 two-part (4.3e-6
with mosaic_gpu's folded decay and 64-key forward tiles, 4.6e-6 with its 128-key ones), 4.1e-3
from the bf16 output with the rows' sums, 2.9e-2
without them (the official kernel's route);
dq's own error there is 3.7e-3. Price: one more tile product in the forward run for a gradient
(3 instead of 2; a forward without a gradient runs 2), none for the row term in the backward
(7 instead of 9), o and o_lo kept as residuals (4 bytes per element, instead of none). The
output under a gradient (from the two-part product) and without one can differ by o's rounding.
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
