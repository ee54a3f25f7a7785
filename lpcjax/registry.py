"""Name -> entry tables for the model families and the data kinds.

Each entry remembers where it was registered (the module, and its file), so that a run
directory can record it and a fresh process (eval.py, generate) can import an entry defined
outside the package before looking its name up (``Registry.get(name, source)``).
"""

import importlib
import importlib.util
import os
import sys

from lpcjax.config import ConfigError, did_you_mean


def module_source(module):
  """{"module", "file"} of an imported module, by name."""
  file = getattr(sys.modules.get(module), "__file__", None)
  return {"module": module, "file": os.path.abspath(file) if file else None}


def caller_source(depth=2):
  """{"module", "file"} of the module ``depth`` frames up: the one calling a ``register``."""
  return module_source(sys._getframe(depth).f_globals.get("__name__", ""))


def import_source(source):
  """Import the module a run recorded; by its file when its name is not importable here (a
  module beside the experiment file, or a script run as __main__)."""
  module, file = source.get("module"), source.get("file")
  if module and module != "__main__":
    try:
      importlib.import_module(module)
      return
    except ModuleNotFoundError as error:
      if error.name != module.partition(".")[0] and error.name != module:
        raise  # the module exists but needs something missing: that is the error to show
  if not file or not os.path.isfile(file):
    return
  name = module if module and module != "__main__" else f"lpcjax_source_{abs(hash(file))}"
  spec = importlib.util.spec_from_file_location(name, file)
  loaded = importlib.util.module_from_spec(spec)
  sys.modules[name] = loaded  # before running it, as an import does (dataclasses look it up)
  spec.loader.exec_module(loaded)


class Registry:
  """``field`` is the config field that names an entry (``model.family``, ``data.kind``), so an
  unknown name is a one-line config error pointing at it."""

  def __init__(self, field, what):
    self.field, self.what, self.entries, self.sources = field, what, {}, {}

  def register(self, name, entry, source=None):
    if name in self.entries:
      raise ValueError(f"{self.what} {name!r} is already registered")
    self.entries[name] = entry
    self.sources[name] = source or {"module": None, "file": None}
    return entry

  def get(self, name, source=None):
    """The entry ``name``; when it is unknown and ``source`` (a ``source_of`` record) is given,
    after importing the module that registered it."""
    if name not in self.entries and source:
      import_source(source)
    if name not in self.entries:
      where = f" (the run recorded it in module {source.get('module')!r})" if source else ""
      raise ConfigError(f"{self.field}: unknown {self.what} {name!r}{where}{did_you_mean(name, self.names())}; "
                        f"known: {', '.join(self.names())}")
    return self.entries[name]

  def source_of(self, name):
    """{"module", "file"}: where ``name`` was registered."""
    return dict(self.sources[name])

  def names(self):
    return sorted(self.entries)
