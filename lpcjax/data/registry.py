"""Data kinds by name (``data.kind``), registered like model families.

A kind is its config class (a subclass of ``lpcjax.config.DataConfig`` holding only its own
fields and checks) and ``make_source(config, seed, split)``, which returns a random-access source
(``len`` + ``__getitem__`` giving one example: a dict of numpy arrays). The Grain pipeline
(``lpcjax.data.make_dataset``) does the rest: shuffling, process sharding, batching, padding
the evaluation set. A family lists the kinds it reads (``Family.data_kinds``).
"""

import dataclasses
from typing import Callable

from lpcjax.registry import Registry, module_source


@dataclasses.dataclass(frozen=True)
class DataKind:
  """``shuffle``: the training split is read in a seeded shuffled order, epoch after epoch
  (off for generated sources, whose every index is already a fresh random example)."""

  name: str
  config_cls: type
  make_source: Callable
  shuffle: bool = True


_KINDS = Registry("data.kind", "kind")
get, names, source_of = _KINDS.get, _KINDS.names, _KINDS.source_of


def register(kind):
  if kind.config_cls.kind != kind.name:
    raise ValueError(f"data kind {kind.name!r}: its config class says kind={kind.config_cls.kind!r}")
  # Where the config class is defined registers the kind (a helper such as register_generated
  # may make the call): importing that module again is what a fresh process needs.
  return _KINDS.register(kind.name, kind, module_source(kind.config_cls.__module__))
