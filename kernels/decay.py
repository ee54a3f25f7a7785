"""The decay c = cumsum(log f) as two float32s, so that c_i - c_j never loses the digits that
matter.

Why. At T = 16k with log f around -1...-4 per step, |c| reaches ~4e4, where one float32 ulp is
~4e-3. A float32 c is then off by a few ulp at every position (a running sum rounds at each
step), and c_i - c_j inherits that absolute error whatever the order of the subtraction: each
weight exp(c_i - c_j) moves by ~1e-3 relative, although the decay that matters, c_i - c_j
itself, is small.

What. c is kept as an unevaluated sum of two float32s, c = hi + lo with hi = fl(c) and
|lo| <= ulp(hi) / 2 (a "double-float": 48 bits of significand), and every tile forms the decay
bias from the parts:

    D_ij = (hi_i - hi_j) + (lo_i - lo_j)                                   (``difference``)

``cumsum`` builds the pair from plain float32 cumsums that are exact, whatever order XLA sums
in: it splits each x_t exactly into x_t = h_t + r_t with h_t on a grid so coarse (2^-24 sigma,
sigma a power of two >= 2 sum|x| of that sequence) that every partial sum of the h's is a
multiple of the grid below sigma, hence a float32 (Rump, Ogita and Oishi's extraction:
h = (sigma + x) - sigma). The remainders r_t are split again the same way, four splits in all;
each gains 23 - log2 T bits (the next sigma is at most T 2^-23 times this one), and only the
cumsum of the last remainders, below T^3 2^-94 sigma each, rounds. The exact partial
sums are then added as a two-float (Knuth's TwoSum, which returns the rounding error of a
float32 addition exactly). Five float32 cumsums and a few elementwise operations: cheap to
compile and to run (a parallel scan of two-float additions compiled ~4 s on CPU per sequence
length, for every test).

Error bound (u = 2^-24, float32 round-to-nearest). |c_t - (hi_t + lo_t)| <= T^5 2^-118 sigma +
u ulp(c) (that last cumsum's worst case, plus the rounding of the low part): below 1e-9 at
T = 16k, |c| = 1e5 (sigma = 2^18). hi_i - hi_j is the correctly rounded difference of
two float32s (exact by Sterbenz when they are within a factor 2), lo_i - lo_j has magnitude at
most ulp(c) and is formed to within u of it, so

    |fl(D_ij) - (c_i - c_j)| <= 2u |c_i - c_j| + 2u ulp(max|c|):

the error scales with the decay itself, not with |c|. A row's softmax weight p_ij is at most
exp(2A + D_ij) (A = scale * max|q| * max|k|, the bound of pruning.py), so keys with a large
|D_ij| carry no weight and sum_j p_ij |D_ij| <= 2A + log T; each output then moves by at most
~2u (2 (2A + log T) + max|s|) max|v| from the decay's rounding, ~1e-5 max|v| at A = 10,
T = 16k, and typically 1e-6, against ~1e-3 for a float32 c at |c| = 4e4.

Gradients. lo is a constant to autodiff (its inputs are stopped): the derivative of c is that
of hi, so a caller's cotangent for lo is not needed. d log f = reverse cumsum of dc runs
through the same compensated scan (``cumsum(..., reverse=True).hi``): dc sums to ~0 over a
sequence, so a float32 running sum would lose the small partial sums to the rounding of the
large ones.

``COMPENSATED = False`` (read when a function is traced) restores the plain float32 cumsum and
lo = 0, i.e. the previous c_i - c_j, for measurements only (benchmarks/decay_precision.py).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

COMPENSATED = True


class TwoFloat(NamedTuple):
  """c = hi + lo, two float32 arrays of one shape (a pytree: slices, pads and ppermutes map
  over both)."""

  hi: jax.Array
  lo: jax.Array


def _two_sum(a, b):
  """(s, e) with s = fl(a + b) and e = a + b - s exactly (Knuth). The error term is a constant
  to autodiff, so s carries the derivative of a + b unchanged."""
  s = a + b
  a, b, s_ = (lax.stop_gradient(x) for x in (a, b, s))
  b_virtual = s_ - a
  return s, (a - (s_ - b_virtual)) + (b - b_virtual)


def add(x, y):
  """x + y of two TwoFloats (broadcasting): TwoSum of the high parts, then the low parts and
  the error renormalized by a second TwoSum, so |lo| <= ulp(hi) / 2 again."""
  s, e = _two_sum(x.hi, y.hi)
  return TwoFloat(*_two_sum(s, e + lax.stop_gradient(x.lo + y.lo)))


def lift(x):
  """A float32 array as a TwoFloat with lo = 0 (exact)."""
  x = jnp.asarray(x, jnp.float32)
  return TwoFloat(x, jnp.zeros_like(x))


def _extract(x, axis):
  """x = head + rest exactly, the heads on a grid (2^-24 sigma, sigma a power of two >= twice
  sum |x| along ``axis``) on which every sum of heads along the axis is a float32: any order
  of summation adds them exactly."""
  _, exponent = jnp.frexp(jnp.sum(jnp.abs(x), axis=axis, keepdims=True))
  sigma = jnp.ldexp(jnp.ones_like(exponent, jnp.float32), exponent + 1)
  head = (sigma + x) - sigma
  return head, x - head


_SPLITS = 4  # each gains 23 - log2 T bits (module docstring)


def _compensated(x, axis, reverse):
  sums, rest = [], x
  for _ in range(_SPLITS):
    head, rest = _extract(rest, axis)
    sums.append(lax.cumsum(head, axis=axis, reverse=reverse))  # exact
  sums.append(lax.cumsum(rest, axis=axis, reverse=reverse))  # tiny terms: the only rounding
  hi, lo = _two_sum(sums[0], sums[1])
  return TwoFloat(*_two_sum(hi, lo + sum(sums[2:])))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _compensated_cumsum(x, axis, reverse):
  return _compensated(x, axis, reverse)


def _cumsum_fwd(x, axis, reverse):
  return _compensated(x, axis, reverse), None


def _cumsum_bwd(axis, reverse, _, ct):
  # c = hi + lo and lo carries no derivative: the transpose of a cumsum is the reverse cumsum
  # of the high part's cotangent, itself compensated (see the module docstring).
  return (_compensated(ct.hi, axis, not reverse).hi,)


_compensated_cumsum.defvjp(_cumsum_fwd, _cumsum_bwd)


def cumsum(x, axis=-1, reverse=False):
  """Prefix sums of a float32 array as a TwoFloat (hi = the correctly rounded sum, to within
  the bound above). With ``COMPENSATED = False``: the plain float32 cumsum and lo = 0."""
  axis = axis % x.ndim
  if not COMPENSATED:
    return lift(lax.cumsum(x.astype(jnp.float32), axis=axis, reverse=reverse))
  return _compensated_cumsum(x.astype(jnp.float32), axis, reverse)


def two_float_cumsum(c, axis):
  """Prefix sums of a TwoFloat along ``axis`` (the ring's sum over earlier shards)."""
  return add(cumsum(c.hi, axis), cumsum(c.lo, axis))


def reverse_cumsum(x, axis=-1):
  """sum_{u >= t} x_u as one float32 array, rounded once from the compensated sum (how every
  backend turns dc into d log f)."""
  return cumsum(x, axis, reverse=True).hi


def as_two_float(c):
  """A TwoFloat unchanged; a plain array (a caller's float32 c) as one with lo = 0."""
  return c if isinstance(c, TwoFloat) else lift(c)


def coarse(c):
  """The high part (c to within half an ulp): enough for bounds such as pruning's, which
  compare block maxima and minima against a threshold."""
  return c.hi if isinstance(c, TwoFloat) else c


def difference(c_rows, c_cols):
  """c_rows - c_cols, broadcasting, in float32 from the two parts: (hi - hi) + (lo - lo).
  Either side may be a plain float32 array (lo = 0)."""
  c_rows, c_cols = as_two_float(c_rows), as_two_float(c_cols)
  return (c_rows.hi - c_cols.hi) + (c_rows.lo - c_cols.lo)


def tree_map(fn, c):
  """``fn`` applied to both parts of a TwoFloat (or to a plain array)."""
  return TwoFloat(fn(c.hi), fn(c.lo)) if isinstance(c, TwoFloat) else fn(c)
