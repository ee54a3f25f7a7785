"""Multi-head causal attention for the LLaMA and Pro blocks, with or without a forget gate.

One module serves the ``transformer`` family (no gate: log f = 0, exactly causal softmax
attention) and the ``fox`` family (Forgetting Attention). Pro-block parts, each switchable for
the paper's ablations (FoX paper, Sec. 3.2 and Table 3):

* KV-shift: k_t = a_t * k~_{t-1} + (1 - a_t) * k~_t with a_t = sigmoid(w . x_t) per head (no bias)
  and k~ = W_k x the unshifted candidate; the same for v with its own gate. It is applied to
  the projected k/v before QK-norm and restarts at every segment start (k~_{-1} = 0).
* QK-norm: RMSNorm over head_dim (eps 1e-5) on q and k; by default one scale shared by all
  heads, as in the released FoX checkpoints (``qk_norm_shared_scale``).
* Output norm and gate: o_proj(RMSNorm_head(o) * sigmoid(W_g x)), norm eps 1e-6, the norm's
  scale shared across heads in the same way.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpcjax.kernels import forgetting_attention, segment_starts, sharded_forgetting_attention
from lpcjax.sharding import attention_mesh_axes

from .common import Projection, RMSNorm, dtype_of, normal_init
from .forget_gate import ForgetGate
from .rope import apply_rope, segment_positions

HEADS = ("activation_batch", "activation_length", "activation_heads", "activation_head_dim")


class KVShift(nn.Module):
  """Data-dependent token shift of one projected stream ([batch, seq, heads, head_dim])."""

  config: object

  @nn.compact
  def __call__(self, x, candidate, segment_ids=None):
    cfg = self.config
    alpha = nn.Dense(cfg.num_heads, use_bias=False, dtype=jnp.float32, param_dtype=jnp.float32,
                     kernel_init=normal_init(cfg.init_std, ("embed", "heads")), name="gate")(
                         x.astype(jnp.float32))
    alpha = jax.nn.sigmoid(alpha)[..., None]  # [batch, seq, heads, 1]
    previous = jnp.pad(candidate, [(0, 0), (1, 0), (0, 0), (0, 0)])[:, :-1]
    if segment_ids is not None:  # nothing shifts across a document boundary
      previous = jnp.where(segment_starts(segment_ids)[:, :, None, None], 0, previous)
    shifted = alpha * previous.astype(jnp.float32) + (1 - alpha) * candidate.astype(jnp.float32)
    return shifted.astype(candidate.dtype)


class ForgettingAttention(nn.Module):
  """x [batch, seq, d_model] -> [batch, seq, d_model].

  ``config`` is a transformer/fox config (see lpcjax.models); the fields read are num_heads,
  resolved_head_dim, d_model, use_rope, rope_theta, forget_gate (+ gate_*), the Pro switches
  (use_qk_norm, use_output_gate, use_output_norm, use_kv_shift), qk_norm_shared_scale, init_std, dtype,
  param_dtype, attention_impl and debug_checks, and attention_window and prune_epsilon if present.
  """

  config: object

  @nn.compact
  def __call__(self, x, segment_ids=None):
    cfg = self.config
    heads, head_dim = cfg.num_heads, cfg.resolved_head_dim
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)

    def project(name):
      return Projection((heads, head_dim), ("embed", "heads", "head_dim"), init_std=cfg.init_std,
                        dtype=dtype, param_dtype=param_dtype, name=name)(x)

    def head_norm(name, eps):
      shape = (head_dim,) if cfg.qk_norm_shared_scale else (heads, head_dim)
      axes = ("head_dim",) if cfg.qk_norm_shared_scale else ("heads", "head_dim")
      return RMSNorm(eps=eps, dtype=dtype, param_dtype=param_dtype, scale_axes=axes,
                     scale_shape=shape, name=name)

    q, k, v = project("q_proj"), project("k_proj"), project("v_proj")
    if cfg.use_kv_shift:
      k = KVShift(cfg, name="k_shift")(x, k, segment_ids)
      v = KVShift(cfg, name="v_shift")(x, v, segment_ids)
    if cfg.use_qk_norm:
      q, k = head_norm("q_norm", 1e-5)(q), head_norm("k_norm", 1e-5)(k)
    if cfg.use_rope:
      positions = segment_positions(segment_ids, x.shape[1])
      q, k = apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta)
    q, k, v = (nn.with_logical_constraint(t, HEADS) for t in (q, k, v))

    if cfg.forget_gate == "none":
      log_fgate = jnp.zeros(x.shape[:2] + (heads,), jnp.float32)
    else:
      log_fgate = ForgetGate(cfg, name="forget_gate")(x)
    options = dict(segment_ids=segment_ids, impl=cfg.attention_impl, debug=cfg.debug_checks,
                   prune_epsilon=getattr(cfg, "prune_epsilon", None),  # FoX configs only
                   window=getattr(cfg, "attention_window", None))  # None: full causal
    # checkify (debug_checks) cannot transform shard_map: debug runs leave attention to GSPMD.
    placement = None if cfg.debug_checks else attention_mesh_axes(x.shape[0], heads)
    if placement is None:
      o = forgetting_attention(q, k, v, log_fgate, **options)
    else:  # a pallas_call cannot be partitioned by GSPMD: run it per (batch, head) shard
      mesh, batch_axes, head_axes = placement
      o = sharded_forgetting_attention(q, k, v, log_fgate, mesh=mesh, batch_axes=batch_axes,
                                       head_axes=head_axes, **options)

    if cfg.use_output_norm:
      o = head_norm("o_norm", 1e-6)(o)
    if cfg.use_output_gate:
      o = o * jax.nn.sigmoid(project("g_proj").astype(jnp.float32)).astype(o.dtype)
    return Projection((cfg.d_model,), ("heads", "head_dim", "embed"), in_ndim=2, init_std=cfg.init_std,
                      dtype=dtype, param_dtype=param_dtype, name="o_proj")(o)
