"""Reusable Flax Linen layers. Each takes one small typed config holding only the fields it reads
(``AttentionConfig``, ``GateConfig``, ``MLPConfig``, ...; see each class's docstring)."""

from .attention import AttentionConfig, ForgettingAttention, KVShift
from .common import RMSNorm
from .forget_gate import ForgetGate, GateConfig, geometric_timescales, timescale_bias
from .lpcsm import (MHC, MHCConfig, ONT, ONTConfig, ControllerConfig, DualTimescaleMemory, LocalAttention,
                    LocalAttentionConfig, MemoryConfig, SparseController, causal_standardize, collapse_streams, expand_streams, linear_recurrence,
                    ont_write, sinkhorn)
from .mlp import MLPConfig, SwiGLU, swiglu_hidden_size
from .pma import EncoderLayer, OverlapAggregator, PMABlock, PMAConfig, PMAStack
from .rope import apply_rope, segment_positions
from .sith import SITHCompressor, sith_filters, sith_peaks

__all__ = ["AttentionConfig", "GateConfig", "MLPConfig", "EncoderLayer", "ForgettingAttention", "KVShift", "OverlapAggregator", "PMABlock", "PMAConfig", "PMAStack",
           "RMSNorm", "ForgetGate", "geometric_timescales", "timescale_bias", "SwiGLU", "swiglu_hidden_size",
           "apply_rope", "segment_positions", "SITHCompressor", "sith_filters", "sith_peaks",
           "LocalAttention", "LocalAttentionConfig", "MHC", "MHCConfig", "ONT", "ONTConfig", "ControllerConfig", "DualTimescaleMemory", "MemoryConfig",
           "SparseController", "causal_standardize", "collapse_streams", "expand_streams", "linear_recurrence",
           "ont_write", "sinkhorn"]
