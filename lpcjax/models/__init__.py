"""Model families, found by name: ``family = lpcjax.models.get("fox")``;
``module = family.build(family.config_cls(...))``. ``Family`` is the contract a family fills in;
``language_model_family`` gives one with the language models' defaults."""

from . import fox, lpcsm, pmt, sith  # noqa: F401  (registers the families)
from .decoder import DecoderLM
from .decoder_config import DecoderConfig, GateFields
from .family import Family, get, names, register, source_of
from .fox import FoXConfig, TransformerConfig
from .language_model import language_model_family
from .lpcsm import LPCSM, LPCSMConfig
from .pmt import PMT, PMTConfig
from .sith import SITHConfig

__all__ = ["DecoderConfig", "DecoderLM", "Family", "FoXConfig", "GateFields", "LPCSM", "LPCSMConfig", "PMT",
           "PMTConfig", "SITHConfig", "TransformerConfig", "get", "language_model_family", "names", "register",
           "source_of"]
