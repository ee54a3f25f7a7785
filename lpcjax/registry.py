"""Name -> entry tables for the model families and the data kinds."""

from lpcjax.config import ConfigError


class Registry:
  """``field`` is the config field that names an entry (``model.family``, ``data.kind``), so an
  unknown name is a one-line config error pointing at it."""

  def __init__(self, field, what):
    self.field, self.what, self.entries = field, what, {}

  def register(self, name, entry):
    if name in self.entries:
      raise ValueError(f"{self.what} {name!r} is already registered")
    self.entries[name] = entry
    return entry

  def get(self, name):
    if name not in self.entries:
      raise ConfigError(f"{self.field}: unknown {self.what} {name!r}; known: {', '.join(self.names())}")
    return self.entries[name]

  def names(self):
    return sorted(self.entries)
