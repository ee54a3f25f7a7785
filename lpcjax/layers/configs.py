"""The layers' configs, one small frozen dataclass per mechanism, apart from the layers so that
they import no JAX: a command line checks a whole config (``lpcjax.experiment``) before JAX
loads. Each layer module re-exports its own (``lpcjax.layers.attention.AttentionConfig``).
Standard library only."""

import dataclasses
import math
from typing import Optional

# The c of the SITH paper's table of windows, 2^(1/4) - 1 (lpcjax.layers.sith says why).
TABLE_C = 2 ** 0.25 - 1

# The compute and parameter dtypes a config may name (lpcjax.layers.common maps them to JAX's).
DTYPE_NAMES = ("float32", "bfloat16", "float16")


GATE_VARIANTS = ("none", "data_dependent", "data_independent", "fixed")


@dataclasses.dataclass(frozen=True)
class GateConfig:
  """What ``ForgetGate`` reads.

  * ``num_heads``: one gate per head.
  * ``variant``: "data_dependent", "data_independent" or "fixed" (see the module docstring).
  * ``t_min``, ``t_max``: the T(b) geometric bias init of the heads (data-independent and fixed
    gates, and the data-dependent one with ``bias_init="timescale"``).
  * ``bias_init``: the data-dependent gate's bias, "zero" (the paper's) or "timescale".
  * ``init_std``: std of the data-dependent gate's weight w.

  The family configs build it with ``gate_config()`` (``lpcjax.models.GateFields``).
  """

  num_heads: int
  variant: str = "data_dependent"
  t_min: float = 2.0
  t_max: float = 128.0
  bias_init: str = "zero"
  init_std: float = 0.02

  def __post_init__(self):
    if self.variant not in GATE_VARIANTS[1:]:
      raise ValueError(f"GateConfig.variant: must be one of {GATE_VARIANTS[1:]}, got {self.variant!r}")
    if self.bias_init not in ("zero", "timescale"):
      raise ValueError(f"GateConfig.bias_init: must be 'zero' or 'timescale', got {self.bias_init!r}")
    if not 0 < self.t_min <= self.t_max:
      raise ValueError(f"GateConfig: need 0 < t_min <= t_max, got ({self.t_min}, {self.t_max})")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """What ``ForgettingAttention`` and ``init_layer_cache`` read.

  * Sizes: ``d_model`` (input and output width), ``num_heads``, ``head_dim``, and
    ``num_kv_heads`` (None: ``num_heads``; fewer: grouped-query attention, it must divide
    ``num_heads``).
  * ``gate``: the forget gate (``GateConfig``, its num_heads = ``num_heads``), or None: no gate,
    log f = 0, exactly causal softmax attention (the ``transformer`` family).
  * ``use_rope``, ``rope_theta``: rotary embedding of q and k and its base.
  * Pro parts (module docstring), each a switch: ``use_qk_norm`` (with ``qk_norm_shared_scale``:
    one QK-norm scale for all heads), ``use_output_norm`` (eps ``norm_eps``),
    ``use_output_gate``, ``use_kv_shift``.
  * The op (``lpcjax.kernels.forgetting_attention``): ``window`` (sliding window; None: full
    causal), ``impl`` (backend), ``prune_epsilon`` (None: exact), ``debug`` (value checks).
  * ``init_std`` (std of every projection), ``dtype`` (compute) and ``param_dtype``, by name.
  """

  d_model: int
  num_heads: int
  head_dim: int
  num_kv_heads: Optional[int] = None
  gate: Optional[GateConfig] = None
  use_rope: bool = True
  rope_theta: float = 10000.0
  use_qk_norm: bool = False
  qk_norm_shared_scale: bool = True
  use_output_norm: bool = False
  use_output_gate: bool = False
  use_kv_shift: bool = False
  norm_eps: float = 1e-6
  window: Optional[int] = None
  impl: str = "auto"
  prune_epsilon: Optional[float] = None
  debug: bool = False
  init_std: float = 0.02
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.kv_heads < 1 or self.num_heads % self.kv_heads:
      raise ValueError(f"AttentionConfig: num_kv_heads={self.num_kv_heads} must be >= 1 and divide "
                       f"num_heads={self.num_heads}")
    if self.gate is not None and self.gate.num_heads != self.num_heads:
      raise ValueError(f"AttentionConfig: gate.num_heads={self.gate.num_heads} != num_heads={self.num_heads}")
    if self.use_rope and self.head_dim % 2:
      raise ValueError(f"AttentionConfig: RoPE needs an even head_dim, got {self.head_dim}")

  @property
  def kv_heads(self):
    """The key/value heads: ``num_kv_heads``, or ``num_heads`` when it is None."""
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


def swiglu_hidden_size(d_model, ratio, multiple_of=256):
  """hidden = multiple_of * ceil(int(d_model * ratio * 2/3) / multiple_of): the 2/3 keeps the
  three SwiGLU matrices at the parameter count of a ratio-wide two-matrix MLP (FoX/LLaMA recipe).

  The product is truncated to an integer before rounding up, as the official FoX code does, so
  that imported models get its widths: a product less than 1 above a multiple stays at that
  multiple (d = 110, ratio 3.5: 256.67 -> 256, where rounding up directly would give 512)."""
  return multiple_of * math.ceil(int(d_model * ratio * 2 / 3) / multiple_of)


@dataclasses.dataclass(frozen=True)
class MLPConfig:
  """What ``SwiGLU`` reads: ``d_model`` (input and output width), ``hidden`` (the width of
  w_gate and w_up, e.g. ``swiglu_hidden_size(d_model, 4.0)``), ``init_std`` (std of every
  kernel), ``dtype`` (compute) and ``param_dtype``, by name ("float32", "bfloat16", "float16").
  The family configs build it with ``mlp_config()``."""

  d_model: int
  hidden: int
  init_std: float = 0.02
  dtype: str = "float32"
  param_dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class ONTConfig:
  """Fields read by ``ONT``. The gain's value, bounds and whether it is learned are NOT FOUND."""

  enabled: bool = True  # False: the plain write (the paper's "ONT disabled" ablation)
  # κ = 1 + (κ_max − 1) σ(θ) ∈ [1, κ_max]: never shrinks novelty (κ ≥ 1 is the paper's
  # "amplified") and cannot blow up the slow state. Learned, one scalar per layer.
  kappa_max: float = 4.0
  kappa_init: float = 2.0  # mid-range (σ(θ) = 1/3): room to move both ways, σ not saturated
  eps: float = 1e-6


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
  # How a chunk becomes its summary. "mean": the chunk's mean, so one token reaches the memory
  # diluted by the chunk's other chunk_size - 1 (an identifier among distractors is lost:
  # docs/mechanisms.md, delayed_id_near). "attention": softmax pooling with one learned query,
  # zero at init, so the summary starts as the mean and can learn to single tokens out.
  summary_pool: str = "attention"
  # Whether each chunk shifts the decays by a learned function of its summary (zero at init:
  # the per-channel decays above): a chunk that carries nothing new can leave the states as
  # they were, one that does can write strongly. False: fixed per-channel decays.
  selective_decay: bool = True
  kappa_max: float = 4.0  # ONT gain bounds and init, see ONTConfig
  kappa_init: float = 2.0
  ont_eps: float = 1e-6
  # The read projections start at zero, so the layer's reads start at 0 and a block adding them
  # to its residual stream starts as if it had no memory (tests set it > 0 to see the reads).
  read_init_std: float = 0.0
  # The summary projection W_c's init. None: 1/√d_model (fan-in). The summary feeds the states,
  # not the residual stream, so it keeps the scale of its input: with the residual streams'
  # 0.02 the summaries started ~0.16 per channel and the decay shifts and reads they drive
  # barely moved in 400 steps (docs/mechanisms.md, delayed_id_near).
  init_std: float | None = None


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
  """Fields read by ``SparseController``. Statistic, normalisation, temperature, threshold tie
  and ratio bounds are NOT FOUND; these are the chosen forms."""

  # ρ = r_min + (r_max − r_min) σ(φ): the paper's "learnable within prescribed bounds".
  ratio_min: float = 0.05
  ratio_max: float = 0.5  # at most every other token fires: the pathway stays sparse
  ratio_init: float = 0.2
  # False: the paper's Stage-B control. φ stays a parameter (so both arms load the same
  # checkpoint) but gets no gradient: ρ is frozen at its init or restored value, and with
  # ``score="learned"`` so is the firing rate (the standardised score fires at rate ≈ ρ).
  learn_ratio: bool = True
  # "learned" (issue #21): a learned score s_t = w · log(e_t² + eps) / ‖w‖ over the error's
  # channels, standardised causally and fired where z_t > Φ⁻¹(1 − ρ). The standardisation
  # removes the score's scale and offset, so nothing but ρ sets the firing rate (ρ is
  # identifiable and starts as the rate) while w chooses which tokens fire.
  # "affine" (the form before issue #21): r_t = log mean(e_t² + eps), standardised, then
  # scale · z + bias − Φ⁻¹(1 − ρ) > 0. Its bias and ρ enter as one offset (the LM gradient on
  # ρ is a fixed multiple of the bias's), and r has near-zero variance while ĥ ≈ 0.
  score: str = "learned"
  # The error is detached: the controller learns when to fire, the predictor is not rewarded
  # for shaping its errors to open or close the gate.
  stop_error_gradient: bool = True
  eps: float = 1e-6
  # No temperature: the forward mask is 1[u > 0] whatever τ is, so a temperature could only
  # rescale the straight-through slope; the surrogate is σ(u) (slope 1/4 at the threshold).

  def __post_init__(self):
    if self.score not in ("learned", "affine"):
      raise ValueError(f"score must be 'learned' or 'affine', got {self.score!r}")


@dataclasses.dataclass(frozen=True)
class MHCConfig:
  """Fields read by ``MHC``. LPC-SM's stream count, iterations, static vs input-dependent mixing
  and stream init are NOT FOUND; the defaults follow REFERENCE.md's mHC."""

  num_streams: int = 4  # the mHC paper's n
  d_model: int = 0  # width of one stream; needed (> 0) only by the dynamic coefficients
  sinkhorn_iterations: int = 20  # the mHC default; converges to ~1e-6 from the identity init
  # Diagonal logit of H_res at init (off-diagonal 0): each stream keeps e^6/(e^6 + n − 1) ≈ 0.99
  # of itself, i.e. ≈ identity, while the off-diagonal gradient is not yet vanishing.
  res_diag_init: float = 6.0
  # True (REFERENCE.md's mHC): the coefficients are α · (RMS-normalised streams @ φ) + static
  # bias, per token; α starts at 0, so the forward starts as the static form and α gets the
  # gradient that switches the input dependence on. False: static learned coefficients only
  # (the form before issue #21).
  dynamic: bool = True
  # φ ~ N(0, 1/(n d)): the projection of the unit-RMS flattened streams has unit scale, so α is
  # in logit units.
  dynamic_init_std: float | None = None  # None: 1/sqrt(n d)
  # "sigmoid": H_pre = σ(·), REFERENCE.md's mHC (the weights need not sum to 1 once trained).
  # "softmax": convex weights (the form before issue #21).
  pre_activation: str = "sigmoid"
  # Symmetry breaking. With copied streams and a symmetric init the forward and every gradient
  # stay symmetric across streams forever (issue #21: mHC was a plain residual with one gain).
  # Post-mix gains b_i = 1 + post_spread · u_i and pre-mix weights a_i = (1 + pre_spread · v_i)/n
  # with u, v zero-mean and orthogonal (``spread_patterns``): Σ b / n = 1, Σ a = 1 and a ⊥ u.
  # Every stream deviation then lies along u (the init H_res = a·I + c·11ᵀ keeps that pattern;
  # ``expand_streams`` and ``collapse_streams`` take the same u and v), so every block input and
  # the readout start exactly as in the plain residual model, while the streams differ and the
  # pre-mix and transport get gradients at init. 0 and 0: the symmetric (inert) init.
  post_spread: float = 0.5
  pre_spread: float = 0.5

  def __post_init__(self):
    if self.pre_activation not in ("sigmoid", "softmax"):
      raise ValueError(f"pre_activation must be 'sigmoid' or 'softmax', got {self.pre_activation!r}")
    if self.dynamic and self.d_model < 1:
      raise ValueError("dynamic mHC needs d_model (the width of one stream) >= 1")
    if not 0.0 <= self.post_spread < 1.0 or not 0.0 <= self.pre_spread < 1.0:
      raise ValueError("post_spread and pre_spread must lie in [0, 1) (gains and weights stay positive)")


@dataclasses.dataclass(frozen=True)
class PMAConfig:
  """The fields a PMA block reads. Defaults follow the PMT spec §4–§6 (the first author's
  later code where the paper's equations were lost)."""

  d_model: int = 64
  num_heads: int = 4
  mlp_dim: int = 256
  num_slots: int = 1  # n_m memory slots per window
  memory: str = "progressive"  # "stateless": fresh states in every window, no carrier, no vertical reuse
  state_attends_prev: bool = True  # write slots also attend the carrier
  write_gate: bool = True  # False: the carrier is replaced by the candidate
  carry_gate: bool = True  # False: fixed mix carry_mix * M̃ + (1 - carry_mix) * M_0
  carry_mix: float = 0.5
  carry_gate_logit: float = -0.5  # g0 = σ(-0.5) ≈ 0.38
  # Init std of M_0. Unit scale, like the RMS-normalized memories it is mixed with: with a small
  # M_0 (0.02), RMSNorm(M̃ + g (M_0 − M̃)) ≈ RMSNorm((1 − g) M̃) does not depend on g, and the
  # reset/carry gate gets almost no gradient (37x less at init, tests/models/test_pmt_train.py).
  base_state_std: float = 1.0
  write_gate_bias: float = -2.0
  write_gate_temperature: float = 2.0
  read_gate_bias: float = -2.0
  state_noise: float = 0.01  # N(0, σ²) on M_0 in training
  aggregator_gamma: float = 1.0  # γ's init: NOT FOUND in the paper; 1 since the SkipGate already scales
  skip_gate_logit: float = -0.5
  rope_theta: float = 10000.0
  dropout: float = 0.0
  norm_eps: float = 1e-6
  streaming: bool = False


def num_windows(num_tokens, window, stride):
  """N = ⌊(K − W)/S⌋ + 1 windows of W tokens at stride S (the valid, non-padded ones)."""
  if not 1 <= window <= num_tokens or not 1 <= stride <= window:
    raise ValueError(f"PMA windows: need 1 <= stride <= window <= tokens, got window={window}, "
                     f"stride={stride}, tokens={num_tokens}")
  return (num_tokens - window) // stride + 1
