"""Model families, found by name: ``family = lpcjax.models.get("fox")``;
``module = family.build(family.config_cls(...))``. ``Family`` is the contract a family fills in;
``language_model_family`` gives one with the language models' defaults.

The family configs import without JAX (``*_config`` modules), so that a command line checks a
config before JAX loads; a family's module (Flax, its kernels) loads when the family is first
looked up (``get``) or one of its names is first used (``lpcjax.lazy``)."""

import importlib

from lpcjax.config import ConfigError, did_you_mean
from lpcjax.lazy import lazy_exports

from . import table
from .decoder_config import LM_DATA_KINDS, DecoderConfig, GateFields, LanguageModelConfig
from .fox_config import FoXConfig, TransformerConfig
from .lpcsm_config import LPCSMConfig
from .pmt_config import PMTConfig
from .sith_config import SITHConfig

LAZY_IMPORTS = {
    "decoder": ("DecoderLM",),
    "family": ("Family",),
    "fox": (),
    "language_model": ("language_model_family",),
    "lpcsm": ("LPCSM",),
    "pmt": ("PMT",),
    "sith": ("SITHLM",),
}

# The families lpcjax ships, by the module (of LAZY_IMPORTS) that registers each.
BUILTIN_FAMILIES = {"transformer": "fox", "fox": "fox", "lpcsm": "lpcsm", "sith": "sith", "pmt": "pmt"}
BUILTIN_CONFIGS = {cls.family: cls for cls in (TransformerConfig, FoXConfig, LPCSMConfig, SITHConfig, PMTConfig)}


def get(name, source=None):
  """The registered ``Family`` ``name`` (a built-in one's module is imported first; with
  ``source``, a run's record of where it was registered, so is a family of one's own)."""
  if name in BUILTIN_FAMILIES:
    importlib.import_module(f"{__name__}.{BUILTIN_FAMILIES[name]}")  # its module registers it
  return table.get(name, source)


def names():
  """Every family's name: the built-in ones and those registered since."""
  return sorted(set(BUILTIN_FAMILIES) | set(table.names()))


def config_class(name, source=None):
  """The config class of family ``name``, without JAX for a built-in family; a family of one's
  own is looked up (``get``), so its module must be imported, or named by ``source``."""
  if name in BUILTIN_CONFIGS:
    return BUILTIN_CONFIGS[name]
  try:
    return get(name, source).config_cls
  except ConfigError:
    raise ConfigError(f"model.family: unknown model family {name!r}{did_you_mean(name, names())}; known: "
                      f"{', '.join(names())}") from None


register = table.register


def source_of(name):
  """{"module", "file"}: where family ``name`` was registered (a built-in one is loaded first)."""
  get(name)
  return table.source_of(name)


def checked_family(config):
  """The family of an ``ExperimentConfig``, after its ``check`` (what needs the family's code):
  how a run starts."""
  found = get(config.model.family)
  found.check(config)
  return found


__all__ = ["BUILTIN_CONFIGS", "ConfigError", "DecoderConfig", "DecoderLM", "Family", "FoXConfig", "GateFields",
           "LM_DATA_KINDS", "LPCSM", "LPCSMConfig", "LanguageModelConfig", "PMT", "PMTConfig", "SITHConfig", "SITHLM",
           "TransformerConfig", "checked_family", "config_class", "get", "language_model_family", "names", "register",
           "source_of"]

__getattr__, __dir__ = lazy_exports(__name__, LAZY_IMPORTS)
