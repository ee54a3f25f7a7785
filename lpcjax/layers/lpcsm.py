"""The reusable LPC-SM mechanisms (lpc-sm-spec.md §3–§5), each usable alone in another model.

* ``sinkhorn``: a doubly stochastic matrix from exp(logits) (Sinkhorn–Knopp, in log space).
* ``MHC``: manifold-constrained hyper-connections, the residual transport across n streams.
* ``ont_write`` / ``ONT``: Orthogonal Novelty Transport, the slow-memory write rule.
* ``DualTimescaleMemory``: chunk summaries into a fast and a slow state, read causally.
* ``SparseController``: error statistics -> a hard sparse event mask with a learnable ratio.

The paper's equations were lost (the spec marks them NOT FOUND). Every such choice is a config
field below, with the default chosen and the reason beside it.
"""

import dataclasses
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax.kernels import forgetting_attention

from .common import Projection, constant_init, dtype_of
from .forget_gate import ForgetGate, GateConfig
from .rope import apply_rope


def _logit(p):
  return math.log(p / (1.0 - p))


def _bounded(logit, low, high):
  """low + (high − low) σ(logit) ∈ [low, high]: an optimizer can never push it out."""
  return low + (high - low) * jax.nn.sigmoid(logit)


def _bounded_init(value, low, high):
  """The logit at which ``_bounded`` gives ``value`` (strictly inside (low, high))."""
  if not low < value < high:
    raise ValueError(f"init {value} must lie strictly inside ({low}, {high})")
  return _logit((value - low) / (high - low))


# ----------------------------------------------------------------------------- Sinkhorn and mHC


def sinkhorn(logits, iterations=20):
  """logits [..., n, n] -> a doubly stochastic matrix [..., n, n] ∝ exp(logits).

  Alternate column and row normalisations of exp(logits), done as log-sum-exp subtractions so
  large logits (the identity init) cannot overflow. The last step normalises rows, so rows sum to
  1 exactly and columns to within the convergence of ``iterations`` (20 is the mHC default).
  """
  def normalize(_, log_p):
    log_p = log_p - jax.nn.logsumexp(log_p, axis=-2, keepdims=True)  # columns
    return log_p - jax.nn.logsumexp(log_p, axis=-1, keepdims=True)  # rows

  # fori_loop with a static count lowers to a scan: one compiled step, still differentiable.
  return jnp.exp(jax.lax.fori_loop(0, iterations, normalize, logits.astype(jnp.float32)))


def expand_streams(x, num_streams):
  """x [batch, seq, d] -> [batch, seq, n, d]: every stream starts as a copy of the embedding."""
  return jnp.broadcast_to(x[..., None, :], x.shape[:-1] + (num_streams, x.shape[-1]))


def collapse_streams(x):
  """x [batch, seq, n, d] -> [batch, seq, d], the mean of the streams.

  Choice: the mean, not learned weights. It has no parameters, equals the plain residual stream
  for n = 1, and at the identity init (all streams equal) returns that common stream, so a model
  with mHC starts as the same function as one without; each block's pre-mix already learns which
  streams to read.
  """
  return jnp.mean(x, axis=-2)


@dataclasses.dataclass(frozen=True)
class MHCConfig:
  """Fields read by ``MHC``. Stream count and iterations are NOT FOUND in LPC-SM."""

  num_streams: int = 4  # the mHC paper's n
  sinkhorn_iterations: int = 20  # the mHC default; converges to ~1e-6 from the identity init
  # Diagonal logit of H_res at init (off-diagonal 0): each stream keeps e^6/(e^6 + n − 1) ≈ 0.99
  # of itself, i.e. ≈ identity, while the off-diagonal gradient is not yet vanishing.
  res_diag_init: float = 6.0


class MHC(nn.Module):
  """Residual transport across n streams around a sub-layer F ([batch, seq, d] -> same):

      h = Σ_i a_i x_i,  a = softmax(pre_logits)          (pre-mix, convex: h on a stream's scale)
      x_i <- Σ_j H[i, j] x_j + b_i F(h),  H = sinkhorn(res_logits),  b = 2 σ(post_logits)

  x [batch, seq, n, d]. Coefficients are static learned parameters (whether LPC-SM makes them
  input-dependent, as mHC does, is NOT FOUND; static is the simplest form that keeps the exact
  identity init). Init: a uniform, H ≈ identity, b = 2σ(0) = 1, so with n = 1 the block is
  exactly x + F(x) and with n streams that hold the same copy it is that copy + F(copy).

  Use ``mhc(x, fn)``, or ``mix_in(x)`` and ``mix_out(x, y)`` when F is not one callable.
  """

  config: MHCConfig

  def setup(self):
    n = self.config.num_streams
    if n < 1:
      raise ValueError(f"num_streams must be >= 1, got {n}")
    diag = self.config.res_diag_init * jnp.eye(n)
    self.pre_logits = self.param("pre_logits", constant_init(0.0, (None,)), (n,))
    self.post_logits = self.param("post_logits", constant_init(0.0, (None,)), (n,))
    self.res_logits = self.param("res_logits", nn.with_logical_partitioning(lambda *_: diag, (None, None)), (n, n))

  def transport(self):
    """H_res [n, n], doubly stochastic."""
    return sinkhorn(self.res_logits, self.config.sinkhorn_iterations)

  def mix_in(self, x):
    """x [batch, seq, n, d] -> h [batch, seq, d], the sub-layer's input."""
    self._check(x)
    weights = jax.nn.softmax(self.pre_logits).astype(x.dtype)
    return jnp.einsum("n,...nd->...d", weights, x)

  def mix_out(self, x, y):
    """x [batch, seq, n, d], y = F(h) [batch, seq, d] -> the updated streams [batch, seq, n, d]."""
    self._check(x)
    post = (2.0 * jax.nn.sigmoid(self.post_logits)).astype(x.dtype)
    return jnp.einsum("ij,...jd->...id", self.transport().astype(x.dtype), x) + post[:, None] * y[..., None, :]

  def __call__(self, x, fn):
    return self.mix_out(x, fn(self.mix_in(x)))

  def _check(self, x):
    if x.ndim < 2 or x.shape[-2] != self.config.num_streams:
      raise ValueError(f"expected [..., {self.config.num_streams} streams, d], got shape {x.shape}")


# ----------------------------------------------------------------------------- local attention


@dataclasses.dataclass(frozen=True)
class LocalAttentionConfig:
  """Fields read by ``LocalAttention``; with ``forget_gate`` set, the ``gate_*`` fields and
  ``init_std`` configure its ``ForgetGate`` (``gate_config()``).

  The window is NOT FOUND in LPC-SM; the family config chooses it.
  """

  d_model: int = 64
  num_heads: int = 4
  head_dim: int = 16
  window: int = 64  # query t sees keys t − window < j ≤ t
  rope_theta: float = 10000.0
  # "none": log f = 0, plain sliding-window softmax attention (LPC-SM's local attention);
  # "data_dependent": FoX's forget gate on top of the window.
  forget_gate: str = "none"
  gate_bias_init: str = "zero"
  gate_t_min: float = 2.0
  gate_t_max: float = 128.0
  init_std: float = 0.02
  dtype: str = "float32"
  param_dtype: str = "float32"
  impl: str = "auto"  # forgetting_attention backend of the parallel pass

  def gate_config(self):
    """The ``GateConfig`` of the forget gate; None when ``forget_gate`` is "none"."""
    if self.forget_gate == "none":
      return None
    return GateConfig(num_heads=self.num_heads, variant=self.forget_gate, t_min=self.gate_t_min,
                      t_max=self.gate_t_max, bias_init=self.gate_bias_init, init_std=self.init_std)


class LocalAttention(nn.Module):
  """Causal sliding-window attention with RoPE: x [batch, seq, d] -> [batch, seq, d].

  The parallel pass is ``forgetting_attention(window=...)`` (the blockwise backends skip every
  tile outside the band). Streaming: give ``cache`` (``init_local_cache``) and the stream position of
  x's first token; the chunk attends over the cached last window − 1 keys and itself,
  materialized (a chunk is short), and the call returns (output, cache) with the cache rolled
  forward. Keys are cached after RoPE at their absolute positions, so the logits are the ones
  the parallel pass computes.
  """

  config: LocalAttentionConfig

  @nn.compact
  def __call__(self, x, cache=None, position=0):
    cfg = self.config
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)

    def project(name, inputs, out_shape, axes, in_ndim=1):
      return Projection(out_shape, axes, in_ndim=in_ndim, init_std=cfg.init_std, dtype=dtype,
                        param_dtype=param_dtype, name=name)(inputs)

    heads = (cfg.num_heads, cfg.head_dim)
    q, k, v = (project(name, x, heads, ("embed", "heads", "head_dim")) for name in ("q_proj", "k_proj", "v_proj"))
    positions = position + jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
    q, k = apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta)
    gate = cfg.gate_config()
    if gate is None:
      log_f = jnp.zeros(x.shape[:2] + (cfg.num_heads,), jnp.float32)
    else:
      log_f = ForgetGate(gate, name="forget_gate")(x)
    if cache is None:
      o = forgetting_attention(q, k, v, log_f, impl=cfg.impl, window=cfg.window)
    else:
      o, cache = _windowed_chunk_attention(q, k, v, log_f, cache)
    out = project("o_proj", o, (cfg.d_model,), ("heads", "head_dim", "embed"), in_ndim=2)
    return out if cache is None else (out, cache)



def init_local_cache(config, batch):
  """An empty streaming cache of ``LocalAttention(config)``: the last window − 1 keys, values,
  their cumulative log f (c) and validity, and the running c of the stream."""
  size, dtype = config.window - 1, dtype_of(config.dtype)
  return {"k": jnp.zeros((batch, size, config.num_heads, config.head_dim), dtype),
          "v": jnp.zeros((batch, size, config.num_heads, config.head_dim), dtype),
          "c": jnp.zeros((batch, size, config.num_heads), jnp.float32),
          "valid": jnp.zeros((batch, size), bool), "c_last": jnp.zeros((batch, config.num_heads), jnp.float32)}


def _windowed_chunk_attention(q, k, v, log_f, cache):
  """Queries i of the chunk over [cached keys ; chunk keys]. Key j of that concatenation is
  w − 1 − j positions before the chunk's first token, so query i sees it iff i ≤ j ≤ i + w − 1
  (causal and inside the window) and it holds a real token. Float32, materialized."""
  size, chunk = cache["k"].shape[1], q.shape[1]
  c = cache["c_last"][:, None] + jnp.cumsum(log_f, axis=1)  # [batch, chunk, heads]
  keys = jnp.concatenate([cache["k"], k.astype(cache["k"].dtype)], axis=1)
  values = jnp.concatenate([cache["v"], v.astype(cache["v"].dtype)], axis=1)
  key_c = jnp.concatenate([cache["c"], c], axis=1)
  valid = jnp.concatenate([cache["valid"], jnp.ones(q.shape[:2], bool)], axis=1)
  i, j = jnp.arange(chunk)[:, None], jnp.arange(size + chunk)[None, :]
  visible = (j >= i) & (j <= i + size) & valid[:, None, None, :]  # [batch, 1, chunk, keys]
  scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
  logits = jnp.einsum("bihd,bjhd->bhij", q.astype(jnp.float32), keys.astype(jnp.float32)) * scale
  logits = logits + jnp.swapaxes(c, 1, 2)[..., :, None] - jnp.swapaxes(key_c, 1, 2)[..., None, :]
  weights = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)
  o = jnp.einsum("bhij,bjhd->bihd", weights, values.astype(jnp.float32)).astype(q.dtype)
  keep = slice(chunk, None)  # roll: the last window − 1 positions stay
  cache = {"k": keys[:, keep], "v": values[:, keep], "c": key_c[:, keep], "valid": valid[:, keep],
           "c_last": c[:, -1]}
  return o, cache


# ----------------------------------------------------------------------------- ONT


def ont_write(write, state, factor, eps=1e-6):
  """Orthogonal Novelty Transport over the last axis: P w + κ (w − P w), P w = (⟨w,s⟩/‖s‖²) s.

  write, state [..., m]; factor κ broadcastable to [..., 1]. The part of the write the state
  already represents is kept exactly, the novelty (orthogonal to the state) is scaled by κ.
  ‖s‖² is floored at ``eps`` (not ε added): the split is exact whenever ‖s‖² > eps, and for a
  (near-)zero state, such as the initial slow state, the whole write counts as novel.
  """
  state = state.astype(write.dtype)
  dot = jnp.sum(write * state, axis=-1, keepdims=True)
  norm2 = jnp.maximum(jnp.sum(state * state, axis=-1, keepdims=True), eps)
  parallel = dot / norm2 * state
  return parallel + factor * (write - parallel)


@dataclasses.dataclass(frozen=True)
class ONTConfig:
  """Fields read by ``ONT``. The gain's value, bounds and whether it is learned are NOT FOUND."""

  enabled: bool = True  # False: the plain write (the paper's "ONT disabled" ablation)
  # κ = 1 + (κ_max − 1) σ(θ) ∈ [1, κ_max]: never shrinks novelty (κ ≥ 1 is the paper's
  # "amplified") and cannot blow up the slow state. Learned, one scalar per layer.
  kappa_max: float = 4.0
  kappa_init: float = 2.0  # mid-range (σ(θ) = 1/3): room to move both ways, σ not saturated
  eps: float = 1e-6


class ONT(nn.Module):
  """(write [..., m], state [..., m]) -> the write to add to ``state``, same shape."""

  config: ONTConfig

  @nn.compact
  def gain(self):
    """κ ∈ [1, κ_max] (a scalar): for callers that apply ``ont_write`` inside a scan."""
    cfg = self.config
    init = _bounded_init(cfg.kappa_init, 1.0, cfg.kappa_max)
    return _bounded(self.param("kappa_logit", constant_init(init, ()), ()), 1.0, cfg.kappa_max)

  def __call__(self, write, state):
    if not self.config.enabled:
      return write
    return ont_write(write, state, self.gain(), self.config.eps)


# ----------------------------------------------------------------------------- dual-timescale memory


def linear_recurrence(decay, inputs, initial):
  """s_k = decay_k ⊙ s_{k−1} + inputs_k along axis 1, s_{−1} = initial, by associative scan.

  decay, inputs [batch, K, m]; initial [batch, m] -> all states [batch, K, m]. The pairs
  (a, b) compose as (a1, b1) then (a2, b2) = (a1 a2, a2 b1 + b2): O(log K) depth, no loop.
  """
  inputs = inputs.at[:, 0].add(decay[:, 0] * initial)

  def combine(first, second):
    return first[0] * second[0], second[0] * first[1] + second[1]

  return jax.lax.associative_scan(combine, (decay, inputs), axis=1)[1]


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
  """Fields read by ``DualTimescaleMemory``. All sizes and update rules are NOT FOUND."""

  d_model: int = 64
  memory_dim: int = 64  # m, width of the chunk summaries and of both states
  chunk_size: int = 64  # tokens per chunk; the sequence length must be a multiple of it
  slow: bool = True  # False: no slow memory (the "− slow memory" ablation)
  ont: bool = True  # False: the slow state takes the plain write (the "− ONT" ablation)
  # Per-channel decays a = σ(θ) ∈ (0, 1), learned. Fast: half-life ~1 chunk (short timescale);
  # slow: 0.95, a memory of ~20 chunks, i.e. ~1k tokens at chunk 64 (the long timescale).
  fast_decay_init: float = 0.5
  slow_decay_init: float = 0.95
  kappa_max: float = 4.0  # ONT gain bounds and init, see ONTConfig
  kappa_init: float = 2.0
  ont_eps: float = 1e-6
  # The read projections start at zero, so the layer's reads start at 0 and a block adding them
  # to its residual stream starts as if it had no memory (tests set it > 0 to see the reads).
  read_init_std: float = 0.0
  init_std: float = 0.02


class DualTimescaleMemory(nn.Module):
  """x [batch, seq, d], state (None: zeros) -> (reads [batch, seq, d], new state).

  Chunk k (of K = seq / chunk_size) has summary c_k = W_c mean(x over chunk k) ∈ R^m. Then
      fast  f_k = a ⊙ f_{k−1} + (1 − a) ⊙ c_k              (linear: one associative scan)
      slow  s_k = λ ⊙ s_{k−1} + (1 − λ) ⊙ ONT(c_k; s_{k−1})  (the write reads s_{k−1}: lax.scan)
  Both are exponential moving averages, so the states stay on the scale of a summary. The slow
  recurrence is non-linear in s, so it runs as a lax.scan over chunks (K steps of O(m) work,
  cheap next to the token path); only chunk boundaries write, never single tokens.

  Every token of chunk k reads the states after chunk k − 1 (chunk 0: the carried-in state):
      read = W_f f_{k−1} + W_s s_{k−1}  ->  [d]
  so nothing from its own chunk or later leaks in. The new state {"fast", "slow"} [batch, m] is
  the state after the last chunk: calling the layer chunk by chunk with the carried state gives
  the same reads as one pass over the whole sequence.
  """

  config: MemoryConfig

  @nn.compact
  def __call__(self, x, state=None):
    cfg = self.config
    batch, seq, d = x.shape
    if seq % cfg.chunk_size:
      raise ValueError(f"seq {seq} must be a multiple of chunk_size {cfg.chunk_size}")
    num_chunks, m = seq // cfg.chunk_size, cfg.memory_dim
    if state is None:
      state = self.initial_state(batch)

    chunks = x.astype(jnp.float32).reshape(batch, num_chunks, cfg.chunk_size, d).mean(axis=2)
    summaries = Projection((m,), ("embed", None), init_std=cfg.init_std, name="summary")(chunks)

    def decay(name, value):
      logit = self.param(name, constant_init(_logit(value), (None,)), (m,))
      return jax.nn.sigmoid(logit)

    fast_decay = decay("fast_decay_logit", cfg.fast_decay_init)
    fast = linear_recurrence(jnp.broadcast_to(fast_decay, summaries.shape), (1 - fast_decay) * summaries,
                             state["fast"])
    fast_before = jnp.concatenate([state["fast"][:, None], fast[:, :-1]], axis=1)  # [batch, K, m]
    read = Projection((d,), (None, "embed"), init_std=cfg.read_init_std, name="read_fast")(fast_before)
    new_state = {"fast": fast[:, -1], "slow": state["slow"]}

    if cfg.slow:
      slow_decay = decay("slow_decay_logit", cfg.slow_decay_init)
      if cfg.ont:  # one learned gain for the layer
        kappa = ONT(ONTConfig(kappa_max=cfg.kappa_max, kappa_init=cfg.kappa_init, eps=cfg.ont_eps), name="ont").gain()

      def step(slow, summary):
        write = ont_write(summary, slow, kappa, cfg.ont_eps) if cfg.ont else summary
        slow = slow_decay * slow + (1 - slow_decay) * write
        return slow, slow

      final_slow, slow_all = jax.lax.scan(step, state["slow"], jnp.swapaxes(summaries, 0, 1))
      slow_all = jnp.swapaxes(slow_all, 0, 1)  # [batch, K, m]
      slow_before = jnp.concatenate([state["slow"][:, None], slow_all[:, :-1]], axis=1)
      read = read + Projection((d,), (None, "embed"), init_std=cfg.read_init_std, name="read_slow")(slow_before)
      new_state["slow"] = final_slow

    reads = jnp.repeat(read, cfg.chunk_size, axis=1).astype(x.dtype)  # chunk k's read to its tokens
    return reads, new_state

  def initial_state(self, batch):
    return initial_memory_state(self.config, batch)


def initial_memory_state(config, batch):
  """The empty state of ``DualTimescaleMemory(config)``: both states zero."""
  zeros = jnp.zeros((batch, config.memory_dim), jnp.float32)
  return {"fast": zeros, "slow": zeros}


# ----------------------------------------------------------------------------- sparse controller


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
  """Fields read by ``SparseController``. Statistic, normalisation, temperature, threshold tie
  and ratio bounds are NOT FOUND; these are the chosen forms."""

  # ρ = r_min + (r_max − r_min) σ(φ): the paper's "learnable within prescribed bounds".
  ratio_min: float = 0.05
  ratio_max: float = 0.5  # at most every other token fires: the pathway stays sparse
  ratio_init: float = 0.2
  # False: the paper's Stage-B control. φ stays a parameter (so both arms load the same
  # checkpoint) but gets no gradient: ρ is frozen at its init or restored value.
  learn_ratio: bool = True
  # p = σ(u / τ) and m = 1[p > 0.5] ⇔ u > 0: τ does not move the forward mask, only the slope
  # of the straight-through gradient. 1 keeps that slope at σ'(0) = 1/4 per unit of u.
  temperature: float = 1.0
  threshold: float = 0.5
  # The statistic r_t = log(mean(e_t²) + eps) is detached: the controller learns when to fire,
  # the predictor is not rewarded for shaping its errors to open or close the gate.
  stop_error_gradient: bool = True
  eps: float = 1e-6


def running_standardize(r, stats=None, eps=1e-6):
  """r [batch, seq] -> ((r_t − μ_t) / σ_t, stats), μ, σ over every position ≤ t of the stream.

  ``stats`` carries the running moments from earlier calls ({"count", "shift", "sum", "sumsq"}
  [batch], from ``initial_stats``; None: the stream starts here), so a stream standardised chunk
  by chunk gives the values of one pass. The moments are of r − shift, shift = the stream's first
  r (the variance is shift invariant; this keeps float32 cancellation small when r has a large
  offset). The stream's first position gives 0.
  """
  if stats is None:
    stats = initial_stats(r.shape[0])
  shift = jnp.where(stats["count"] > 0, stats["shift"], r[:, 0])
  centred = r - shift[:, None]
  count = stats["count"][:, None] + jnp.arange(1, r.shape[1] + 1, dtype=r.dtype)
  total = stats["sum"][:, None] + jnp.cumsum(centred, axis=1)
  total_sq = stats["sumsq"][:, None] + jnp.cumsum(centred * centred, axis=1)
  mean = total / count
  var = jnp.maximum(total_sq / count - mean * mean, 0.0)
  z = (centred - mean) * jax.lax.rsqrt(var + eps)
  return z, {"count": count[:, -1], "shift": shift, "sum": total[:, -1], "sumsq": total_sq[:, -1]}


def initial_stats(batch):
  zeros = jnp.zeros((batch,), jnp.float32)
  return {"count": zeros, "shift": zeros, "sum": zeros, "sumsq": zeros}


def causal_standardize(r, eps=1e-6):
  """r [batch, seq] -> (r_t − μ_t) / σ_t with μ, σ over positions ≤ t (no future token leaks)."""
  return running_standardize(r, None, eps)[0]


class ControllerOutput(NamedTuple):
  mask: jax.Array  # [batch, seq], 0/1 forward, straight-through gradient
  p: jax.Array  # [batch, seq], σ(u / τ)
  ratio: jax.Array  # (), the sparse ratio ρ
  aux: jax.Array  # (), (mean(mask) − ρ)²
  stats: dict  # the running moments after this call (see ``running_standardize``)


class SparseController(nn.Module):
  """error e [batch, seq, d] (and optionally the carried ``stats``) -> ``ControllerOutput``.

      r_t = log(mean(e_t²) + eps),  z_t = running_standardize(r)_t
      u_t = scale · z_t + bias − Φ⁻¹(1 − ρ),  p_t = σ(u_t / τ)
      m_t = 1[p_t > threshold] forward, dm/dp = 1 backward (straight through)

  Tie to ρ: z is roughly standard normal, so shifting it by the normal quantile Φ⁻¹(1 − ρ)
  makes a fraction ≈ ρ of tokens fire at init (scale 1, bias 0), and ρ receives the task
  gradient through that shift. aux = (mean(m) − ρ)² is returned for the model to log or to add
  with a weight, holding the realised rate near ρ once scale and bias move.
  """

  config: ControllerConfig

  @nn.compact
  def __call__(self, error, stats=None):
    cfg = self.config
    scale = self.param("scale", constant_init(1.0, ()), ())
    bias = self.param("bias", constant_init(0.0, ()), ())
    phi = self.param("ratio_logit", constant_init(_bounded_init(cfg.ratio_init, cfg.ratio_min, cfg.ratio_max), ()), ())
    if not cfg.learn_ratio:
      phi = jax.lax.stop_gradient(phi)
    ratio = _bounded(phi, cfg.ratio_min, cfg.ratio_max)

    error = error.astype(jnp.float32)
    if cfg.stop_error_gradient:
      error = jax.lax.stop_gradient(error)
    r = jnp.log(jnp.mean(error * error, axis=-1) + cfg.eps)
    z, stats = running_standardize(r, stats, cfg.eps)
    u = scale * z + bias - jax.scipy.special.ndtri(1.0 - ratio)
    p = jax.nn.sigmoid(u / cfg.temperature)
    hard = (p > cfg.threshold).astype(p.dtype)
    mask = hard + (p - jax.lax.stop_gradient(p))  # p − p = 0 exactly: forward is 0/1
    aux = jnp.square(jnp.mean(mask) - ratio)
    return ControllerOutput(mask, p, ratio, aux, stats)
