"""Reusable Flax Linen layers, one module per mechanism. Each takes one small typed config holding
only the fields it reads (``AttentionConfig``, ``GateConfig``, ``MLPConfig``, ...; see each class's
docstring), so it can live in someone else's model."""

from .attention import AttentionConfig, ForgettingAttention, KVShift, init_layer_cache, init_window_cache
from .common import RMSNorm
from .controller import ControllerConfig, SparseController, causal_standardize, running_standardize
from .forget_gate import ForgetGate, GateConfig, geometric_timescales, timescale_bias
from .memory import DualTimescaleMemory, MemoryConfig, linear_recurrence
from .mhc import MHC, MHCConfig, collapse_streams, expand_streams, sinkhorn
from .mlp import MLPConfig, SwiGLU, swiglu_hidden_size
from .ont import ONT, ONTConfig, ont_write
from .pma import EncoderLayer, OverlapAggregator, PMABlock, PMAConfig, PMAStack
from .rope import apply_rope, segment_positions
from .sith import SITHCompressor, sith_filters, sith_peaks

__all__ = ["AttentionConfig", "ControllerConfig", "DualTimescaleMemory", "EncoderLayer", "ForgetGate",
           "ForgettingAttention", "GateConfig", "KVShift", "MHC", "MHCConfig", "MLPConfig", "MemoryConfig", "ONT",
           "ONTConfig", "OverlapAggregator", "PMABlock", "PMAConfig", "PMAStack", "RMSNorm", "SITHCompressor",
           "SparseController", "SwiGLU", "apply_rope", "causal_standardize", "collapse_streams", "expand_streams",
           "geometric_timescales", "init_layer_cache", "init_window_cache", "linear_recurrence", "ont_write",
           "running_standardize", "segment_positions", "sinkhorn", "sith_filters", "sith_peaks",
           "swiglu_hidden_size", "timescale_bias"]
