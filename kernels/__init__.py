"""lpcjax.kernels: forgetting attention (reference, blockwise XLA, and GPU kernels when present).

This folder is installed as ``lpcjax.kernels`` (see pyproject.toml); import it by that name.
Its names load on first use (``lpcjax.lazy``): importing the package, or a config check, loads
no kernel (importing one submodule loads that submodule), and the backends' table is filled
(``api``) before any of its names is read through the package.
"""

from lpcjax.lazy import lazy_exports

LAZY_IMPORTS = {
    "api": ("Backend", "PairKernels", "available_impls", "forgetting_attention", "ordered_backends",
            "platform_problem", "register_backend", "resolve", "source_of", "unsupported"),
    "block_sizes": ("BlockSizes",),
    "reference": ("reference_attention",),
    "segments": ("segment_starts",),
    "sharded": ("sharded_forgetting_attention",),
}

__all__ = ["Backend", "BlockSizes", "PairKernels", "available_impls", "forgetting_attention", "ordered_backends",
           "platform_problem", "register_backend", "resolve", "source_of", "unsupported",
           "sharded_forgetting_attention",
           "reference_attention", "segment_starts"]

__getattr__, __dir__ = lazy_exports(__name__, LAZY_IMPORTS)
