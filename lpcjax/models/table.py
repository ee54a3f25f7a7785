"""The table of registered families, by name. Standard library only: the package looks names
up here before any family's module (or JAX) is loaded."""

from lpcjax.registry import Registry, caller_source

_FAMILIES = Registry("model.family", "model family")
get, names, source_of = _FAMILIES.get, _FAMILIES.names, _FAMILIES.source_of


def register(family):
  """Add ``family`` (a ``lpcjax.models.Family``) to the table, remembering the calling module:
  runs record it, so that a fresh eval.py imports a family defined outside the package
  (``get(name, source)``)."""
  return _FAMILIES.register(family.name, family, caller_source())
