"""Model families, found by name: ``family = lpcjax.models.get("fox")``;
``module = family.build(family.config_cls(...))``."""

from . import fox, transformer  # noqa: F401  (registers the families)
from .decoder import DecoderLM
from .fox import FoXConfig
from .registry import Family, get, names, register
from .transformer import TransformerConfig

__all__ = ["DecoderLM", "Family", "FoXConfig", "TransformerConfig", "get", "names", "register"]
