"""lpcjax.kernels: forgetting attention (reference, blockwise XLA, and GPU kernels when present).

This folder is installed as ``lpcjax.kernels`` (see pyproject.toml); import it by that name.
"""

# Each backend's file registers it in the table (backends.py); importing them fills the table.
from . import mosaic_gpu, pallas_gpu, pallas_tpu, reference, triton_backend, xla_blockwise  # noqa: F401
from .api import available_impls, forgetting_attention, register_backend
from .backends import Backend, PairKernels, ordered_backends, platform_problem, resolve, source_of, unsupported
from .block_sizes import BlockSizes
from .sharded import sharded_forgetting_attention
from .reference import reference_attention
from .segments import segment_starts

__all__ = ["Backend", "BlockSizes", "PairKernels", "available_impls", "forgetting_attention", "ordered_backends",
           "platform_problem", "register_backend", "resolve", "source_of", "unsupported",
           "sharded_forgetting_attention",
           "reference_attention", "segment_starts"]
