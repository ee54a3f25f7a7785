"""Packages whose heavy parts load on first use, so that the light ones (the configs) import
without JAX: a command line checks its config and paths before JAX loads (about a second
instead of four).

A package's ``__init__`` lists its lazily loaded names by submodule, ``LAZY_IMPORTS =
{"attention": ("ForgettingAttention", ...)}``, and ends with ``__getattr__, __dir__ =
lazy_exports(__name__, LAZY_IMPORTS)``: ``from lpcjax.layers import ForgettingAttention``
then imports ``lpcjax.layers.attention`` at that moment (PEP 562). tests/test_imports.py
reads the table as the package's imports. Standard library only.
"""

import importlib
import importlib.util
import sys


def lazy_exports(package, table):
  """(``__getattr__``, ``__dir__``) of ``package`` for the names of ``table`` ({submodule:
  names}); any submodule's own name (``lpcjax.models.fox``) is that submodule, imported."""
  owner = {name: f"{package}.{module}" for module, names in table.items() for name in names}

  def __getattr__(name):
    if name in owner:
      value = getattr(importlib.import_module(owner[name]), name)
    elif importlib.util.find_spec(f"{package}.{name}") is not None:
      value = importlib.import_module(f"{package}.{name}")
    else:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    setattr(sys.modules[package], name, value)  # loaded once: later lookups skip __getattr__
    return value

  def __dir__():
    return sorted(set(vars(sys.modules[package])) | set(owner))

  return __getattr__, __dir__
