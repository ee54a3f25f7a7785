"""lpcjax.kernels: forgetting attention (reference, blockwise XLA, and GPU kernels when present).

This folder is installed as ``lpcjax.kernels`` (see pyproject.toml); import it by that name.
"""

from .api import available_impls, forgetting_attention, register_backend
from .block_sizes import BlockSizes
from .sharded import sharded_forgetting_attention
from .reference import reference_attention
from .segments import segment_starts

__all__ = ["BlockSizes", "available_impls", "forgetting_attention", "register_backend",
           "sharded_forgetting_attention",
           "reference_attention", "segment_starts"]
