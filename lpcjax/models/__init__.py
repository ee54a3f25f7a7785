"""Model families, found by name: ``family = lpcjax.models.get("fox")``;
``module = family.build(family.config_cls(...))``."""

from . import fox, lpcsm, pmt, sith, transformer  # noqa: F401  (registers the families)
from .decoder import DecoderLM
from .fox import FoXConfig
from .lpcsm import LPCSM, LPCSMConfig
from .pmt import PMT, PMTConfig
from .registry import Family, get, names, register
from .sith import SITHConfig
from .transformer import TransformerConfig

__all__ = ["DecoderLM", "Family", "FoXConfig", "LPCSM", "LPCSMConfig", "PMT", "PMTConfig", "SITHConfig", "TransformerConfig", "get", "names", "register"]
