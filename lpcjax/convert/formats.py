"""The PyTorch FoX formats lpcjax converts, and how each one's config.json maps to a family config.

* ``official``: the FoX authors' package (``forgetting_transformer``). Model types
  ``forgetting_transformer-project_fox`` (FoX, LLaMA or Pro parts, fgate types ``full``,
  ``bias_only``, ``fixed``, and ``none``, which is how the authors built their Transformer (Pro)
  baseline) and ``transformer-project_fox`` (their Transformer (LLaMA) baseline). Their first
  release called these ``forgetting_transformer`` and ``transformer``; a config.json with
  ``fgate_type`` is read as official whatever its model_type.
* ``fla``: flash-linear-attention's FoX, model type ``forgetting_transformer``: data-dependent
  gate, optional output gate and per-head QK-norm, no positional embedding, no KV-shift, no
  output norm.

Grouped-query attention (``num_kv_heads`` < ``num_heads``, consecutive query heads sharing a
key/value head in both packages, as in lpcjax) converts both ways for fla's FoX and the
official Transformer (LLaMA) baseline. The official FoX layer has none: its
ForgettingAttentionLayer raises NotImplementedError ("GQA has not been tested") for any
num_kv_heads, so such a config.json is refused on import, and a FoX (or Pro) model with
num_kv_heads exports only as fla.

Options lpcjax cannot represent are refused with a one-line ConvertError naming the config.json
key (or the lpcjax field, when exporting). Options that do not change what the PyTorch model
computes (fused kernels, max_position_embeddings, training-loss switches) are ignored.
"""

import math

from lpcjax.layers.mlp import swiglu_hidden_size
from lpcjax.models import FoXConfig, TransformerConfig

from .hf_files import ConvertError

OFFICIAL_FOX = "forgetting_transformer-project_fox"
OFFICIAL_TRANSFORMER = "transformer-project_fox"
FLA_FOX = "forgetting_transformer"
FORMATS = ("official", "fla")

# official fgate_type <-> lpcjax forget_gate ("none" is the transformer family)
OFFICIAL_GATES = {"full": "data_dependent", "bias_only": "data_independent", "fixed": "fixed"}


def require(condition, key, message):
  if not condition:
    raise ConvertError(f"{key}: {message}")


def detect(hf):
  """("official" | "fla", model_type as lpcjax reads it) of a config.json dict."""
  model_type = hf.get("model_type")
  if model_type in (OFFICIAL_FOX, OFFICIAL_TRANSFORMER):
    return "official", model_type
  if model_type == FLA_FOX:
    # Both packages used this name (the official one before it added a suffix); only its
    # config has forget-gate types.
    return ("official", OFFICIAL_FOX) if "fgate_type" in hf else ("fla", FLA_FOX)
  if model_type == "transformer" and "rope_base" in hf:
    return "official", OFFICIAL_TRANSFORMER
  raise ConvertError(f"model_type: {model_type!r} is not a model lpcjax converts; it reads {OFFICIAL_FOX!r}, "
                     f"{OFFICIAL_TRANSFORMER!r} (the FoX authors' package) and {FLA_FOX!r} (flash-linear-attention)")


def _mlp_fields(d_model, hidden_ratio, intermediate_size):
  """(mlp_ratio, mlp_multiple_of) giving the PyTorch model's SwiGLU width. Both packages use
  256 * ceil(int(d * ratio * 2/3) / 256) unless intermediate_size is set, like lpcjax; an
  explicit width w that no ratio gives at multiple 256 becomes ratio 1.5 w / d at multiple w."""
  ratio = 4.0 if hidden_ratio is None else float(hidden_ratio)
  width = intermediate_size or swiglu_hidden_size(d_model, ratio, 256)
  if swiglu_hidden_size(d_model, ratio, 256) == width:
    return ratio, 256
  exact = 1.5 * width / d_model
  require(swiglu_hidden_size(d_model, exact, width) == width, "intermediate_size",
          f"lpcjax cannot express a SwiGLU width of {width} at hidden_size {d_model}")
  return exact, width


def _common(hf):
  """The family-config fields every format shares; refuses what none of them has in lpcjax."""
  d_model, heads = hf["hidden_size"], hf["num_heads"]
  require(d_model % heads == 0, "num_heads", f"hidden_size={d_model} is not divisible by num_heads={heads}")
  kv_heads = hf.get("num_kv_heads")
  require(kv_heads is None or (isinstance(kv_heads, int) and 1 <= kv_heads and heads % kv_heads == 0),
          "num_kv_heads", f"{kv_heads} key/value heads for {heads} query heads: they must divide num_heads")
  require(hf.get("hidden_act", "swish") == "swish", "hidden_act",
          f"{hf.get('hidden_act')!r}: lpcjax's MLP is SwiGLU ('swish')")
  mlp_ratio, multiple_of = _mlp_fields(d_model, hf.get("hidden_ratio", 4), hf.get("intermediate_size"))
  return dict(vocab_size=hf["vocab_size"], d_model=d_model, num_layers=hf["num_hidden_layers"], num_heads=heads,
              num_kv_heads=None if kv_heads in (None, heads) else kv_heads,
              mlp_ratio=mlp_ratio, mlp_multiple_of=multiple_of, norm_eps=hf.get("norm_eps", 1e-6),
              init_std=hf.get("initializer_range", 0.02), tie_embeddings=bool(hf.get("tie_word_embeddings", False)))


def _parts(qk_norm=False, output_gate=False, output_norm=False, kv_shift=False):
  """The Pro switches, all explicit; block "pro" when all are on (it then only names the model)."""
  parts = dict(qk_norm=bool(qk_norm), output_gate=bool(output_gate), output_norm=bool(output_norm),
               kv_shift=bool(kv_shift))
  return dict(parts, block="pro" if all(parts.values()) else "llama")


def model_config(fmt, model_type, hf, **overrides):
  """The lpcjax family config (FoXConfig or TransformerConfig) of a config.json dict."""
  if fmt == "fla":
    fields = _fla_fields(hf)
    return FoXConfig(**fields, **overrides)
  if model_type == OFFICIAL_TRANSFORMER:
    return TransformerConfig(**_common(hf), **_parts(), use_rope=hf.get("use_rope", True),
                             rope_theta=float(hf.get("rope_base", 500000.0)),
                             attention_window=hf.get("window_size"), **overrides)
  return _official_fox(hf, overrides)


def _official_fox(hf, overrides):
  require(hf.get("num_kv_heads") in (None, hf["num_heads"]), "num_kv_heads",
          f"{hf.get('num_kv_heads')} key/value heads for {hf['num_heads']} query heads: the official FoX layer has "
          "no grouped-query attention (it raises NotImplementedError for num_kv_heads)")
  require(hf.get("ogate_act", "sigmoid") == "sigmoid", "ogate_act",
          f"{hf.get('ogate_act')!r}: lpcjax's output gate is a sigmoid")
  require(bool(hf.get("use_k_shift")) == bool(hf.get("use_v_shift")), "use_k_shift",
          f"use_k_shift={hf.get('use_k_shift')} with use_v_shift={hf.get('use_v_shift')}: lpcjax shifts keys and "
          "values together")
  # window_size is documented as unused by the official FoX layer, which indeed ignores it.
  fields = dict(_common(hf), **_parts(hf.get("qk_norm"), hf.get("use_output_gate"), hf.get("use_output_norm"),
                                      hf.get("use_k_shift")),
                use_rope=bool(hf.get("use_rope", False)), rope_theta=float(hf.get("rope_base", 500000.0)),
                qk_norm_shared_scale=bool(hf.get("qk_norm_share_param_across_head", False)))
  fgate = hf.get("fgate_type", "full")
  if fgate == "none":  # the authors' Transformer (Pro) baseline: log f = 0, exactly causal attention
    return TransformerConfig(**fields, **overrides)
  require(fgate in OFFICIAL_GATES, "fgate_type", f"unknown forget-gate type {fgate!r}")
  if hf.get("fgate_bias_init") or fgate == "fixed":
    t_min, t_max = hf.get("decay_time_min"), hf.get("decay_time_max")
    require(t_min is not None and t_max is not None, "decay_time_min",
            f"fgate_type={fgate!r} with fgate_bias_init needs decay_time_min and decay_time_max")
    fields.update(gate_t_min=float(t_min), gate_t_max=float(t_max))
  tolerance = hf.get("log_pruning_tolerance")
  if tolerance is not None:  # both prune tiles whose weight is below epsilon; the bounds differ
    fields["prune_epsilon"] = math.exp(tolerance)
  return FoXConfig(**fields, forget_gate=OFFICIAL_GATES[fgate], **overrides)


def _fla_fields(hf):
  require(not hf.get("qkv_bias"), "qkv_bias", "lpcjax's q/k/v projections have no bias")
  require(hf.get("attnres_block_size") is None, "attnres_block_size", "lpcjax has no attention residuals")
  require(hf.get("window_size") is None, "window_size",
          "flash-linear-attention's FoX applies it to its decoding cache only (its parallel pass attends to "
          "everything), so no lpcjax model computes the same function")
  # fla's QK-norm is a GroupNorm over heads: one scale per channel of every head.
  return dict(_common(hf), **_parts(qk_norm=hf.get("qk_norm"), output_gate=hf.get("use_output_gate")),
              use_rope=False, qk_norm_shared_scale=False, forget_gate="data_dependent")


# ----------------------------------------------------------------------------- export


def _mlp_ratio(cfg):
  return cfg.mlp_ratio if cfg.mlp_ratio is not None else (3.5 if cfg.block == "pro" else 4.0)


def _export_common(cfg, field_prefix="model"):
  require(cfg.head_dim in (None, cfg.d_model // cfg.num_heads), f"{field_prefix}.head_dim",
          f"{cfg.head_dim} with d_model={cfg.d_model} and {cfg.num_heads} heads: the PyTorch models use "
          "d_model / num_heads")
  return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers,
              num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, hidden_ratio=_mlp_ratio(cfg),
              intermediate_size=cfg.mlp_hidden_size, hidden_act="swish", initializer_range=cfg.init_std,
              norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, torch_dtype="float32")


def hf_config(fmt, cfg):
  """The config.json dict of a transformer/fox family config in format ``fmt``."""
  require(cfg.family in ("fox", "transformer"), "model.family",
          f"{cfg.family!r}: only the fox and transformer families have PyTorch counterparts")
  if fmt == "fla":
    return _fla_config(cfg)
  require(fmt == "official", "--format", f"{fmt!r}; choose from {FORMATS}")
  common = _export_common(cfg)
  pro = cfg.use_qk_norm or cfg.use_output_gate or cfg.use_output_norm or cfg.use_kv_shift
  if cfg.family == "transformer" and not pro:
    return dict(common, model_type=OFFICIAL_TRANSFORMER, architectures=["TransformerForCausalLM"],
                use_rope=cfg.use_rope, rope_base=cfg.rope_theta, window_size=cfg.attention_window)
  require(cfg.attention_window is None, "model.attention_window",
          "the official FoX layer has no sliding window (its LLaMA Transformer has; FoX and Pro blocks do not)")
  require(cfg.num_kv_heads in (None, cfg.num_heads), "model.num_kv_heads",
          "the official FoX layer has no grouped-query attention (its LLaMA Transformer has); export with --format fla")
  fox = cfg.family == "fox"
  gate = {v: k for k, v in OFFICIAL_GATES.items()}[cfg.forget_gate] if fox else "none"
  bias_init = gate in ("bias_only", "fixed")  # the official code requires it for "fixed"
  epsilon = getattr(cfg, "prune_epsilon", None)
  return dict(common, model_type=OFFICIAL_FOX, architectures=["ForgettingTransformerForCausalLM"],
              use_rope=cfg.use_rope, rope_base=cfg.rope_theta, window_size=None,
              use_output_gate=cfg.use_output_gate, ogate_act="sigmoid", use_output_norm=cfg.use_output_norm,
              qk_norm=cfg.use_qk_norm, qk_norm_share_param_across_head=cfg.qk_norm_shared_scale,
              use_k_shift=cfg.use_kv_shift, use_v_shift=cfg.use_kv_shift, fgate_type=gate,
              fgate_bias_init=bias_init, decay_time_min=cfg.gate_t_min if bias_init else None,
              decay_time_max=cfg.gate_t_max if bias_init else None,
              log_pruning_tolerance=math.log(epsilon) if epsilon else None)


def _fla_config(cfg):
  require(cfg.family == "fox", "model.family", "flash-linear-attention's FoX always has a forget gate")
  require(cfg.forget_gate == "data_dependent", "model.forget_gate",
          f"{cfg.forget_gate!r}: flash-linear-attention's FoX has the data-dependent gate only")
  for field, on in (("use_rope", cfg.use_rope), ("kv_shift", cfg.use_kv_shift), ("output_norm", cfg.use_output_norm)):
    require(not on, f"model.{field}", "flash-linear-attention's FoX has none; export with --format official")
  require(cfg.attention_window is None, "model.attention_window",
          "flash-linear-attention's FoX windows only its decoding cache; export with --format official")
  # prune_epsilon is dropped: the exported model computes the exact (unpruned) attention.
  return dict(_export_common(cfg), model_type=FLA_FOX, architectures=["ForgettingTransformerForCausalLM"],
              qkv_bias=False, qk_norm=cfg.use_qk_norm, window_size=None, use_output_gate=cfg.use_output_gate)
