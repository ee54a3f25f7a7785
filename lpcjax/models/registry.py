"""Model families by name: ``lpcjax.models.get("fox")``."""

import dataclasses
from typing import Callable

from lpcjax.losses import lm_loss


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: its frozen config class and the Linen module built from one config.

  Every language-model family shares one calling convention, so training and evaluation never
  branch on the family: ``module.apply({"params": p}, tokens, segment_ids=None)`` returns
  float32 logits [batch, seq, vocab] and position t sees only tokens <= t.

  ``loss(apply_fn, params, batch) -> (scalar loss, metrics dict)`` is what training minimizes;
  families with other objectives (auxiliary losses, contrastive pre-training, losses on part of
  the window) supply their own.
  """

  name: str
  config_cls: type
  module_cls: type
  description: str = ""
  loss: Callable = lm_loss

  def build(self, config):
    if not isinstance(config, self.config_cls):
      raise TypeError(f"family {self.name!r} needs a {self.config_cls.__name__}, got {type(config).__name__}")
    return self.module_cls(config)


_FAMILIES = {}


def register(family):
  if family.name in _FAMILIES:
    raise ValueError(f"model family {family.name!r} is already registered")
  _FAMILIES[family.name] = family
  return family


def get(name):
  if name not in _FAMILIES:
    raise KeyError(f"unknown model family {name!r}; known: {sorted(_FAMILIES)}")
  return _FAMILIES[name]


def names():
  return sorted(_FAMILIES)
