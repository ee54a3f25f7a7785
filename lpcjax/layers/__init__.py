"""Reusable Flax Linen layers, one module per mechanism. Each takes one small typed config holding
only the fields it reads (``AttentionConfig``, ``GateConfig``, ``MLPConfig``, ...; see each class's
docstring), so it can live in someone else's model."""

from lpcjax.lazy import lazy_exports

from .configs import (AttentionConfig, ControllerConfig, GateConfig, MHCConfig, MLPConfig, MemoryConfig, ONTConfig,
                      PMAConfig, swiglu_hidden_size)

# The modules themselves (Flax, JAX) load when one of their names is first used: the configs
# above import without JAX (lpcjax.lazy).
LAZY_IMPORTS = {
    "attention": ("ForgettingAttention", "KVShift", "init_layer_cache", "init_window_cache"),
    "common": ("RMSNorm",),
    "controller": ("SparseController", "causal_standardize", "running_standardize"),
    "forget_gate": ("ForgetGate", "geometric_timescales", "timescale_bias"),
    "memory": ("DualTimescaleMemory", "linear_recurrence"),
    "mhc": ("MHC", "collapse_streams", "expand_streams", "sinkhorn"),
    "mlp": ("SwiGLU",),
    "ont": ("ONT", "ont_write"),
    "pma": ("EncoderLayer", "OverlapAggregator", "PMABlock", "PMAStack"),
    "rope": ("apply_rope", "segment_positions"),
    "sith": ("SITHCompressor", "sith_filters", "sith_peaks"),
}

__all__ = ["AttentionConfig", "ControllerConfig", "DualTimescaleMemory", "EncoderLayer", "ForgetGate",
           "ForgettingAttention", "GateConfig", "KVShift", "MHC", "MHCConfig", "MLPConfig", "MemoryConfig", "ONT",
           "ONTConfig", "OverlapAggregator", "PMABlock", "PMAConfig", "PMAStack", "RMSNorm", "SITHCompressor",
           "SparseController", "SwiGLU", "apply_rope", "causal_standardize", "collapse_streams", "expand_streams",
           "geometric_timescales", "init_layer_cache", "init_window_cache", "linear_recurrence", "ont_write",
           "running_standardize", "segment_positions", "sinkhorn", "sith_filters", "sith_peaks",
           "swiglu_hidden_size", "timescale_bias"]

__getattr__, __dir__ = lazy_exports(__name__, LAZY_IMPORTS)
