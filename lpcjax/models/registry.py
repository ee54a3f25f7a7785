"""Model families by name: ``lpcjax.models.get("fox")``.

The family is the one place that knows what its model reads, how it is scored and evaluated,
so that train.py and eval.py never branch on the family. See the README, "Adding a family".
"""

import dataclasses
from typing import Any, Callable, Optional

import jax.numpy as jnp

from lpcjax.config import require
from lpcjax.losses import lm_loss
from lpcjax.registry import Registry

LM_DATA_KINDS = ("mqar", "text", "tokens")


def token_inputs(data_config):
  """Example model inputs for abstract init: int32 tokens [1, seq_len]."""
  return (jnp.zeros((1, data_config.seq_len), jnp.int32),)


def check_vocab(config):
  """A language model's vocabulary holds every token of its data."""
  data_vocab = config.data.vocab_size
  require(config.model.vocab_size >= data_vocab, "model.vocab_size",
          f"{config.model.vocab_size} is smaller than the {config.data.kind} data's {data_vocab} tokens")


def language_model_evaluator(sequence_logits=None):
  """The evaluator factory of a language-model family; ``sequence_logits`` replaces the plain
  forward pass for models that read fixed windows (see LanguageModelEvaluator)."""
  def make():
    from lpcjax.evaluation import language_model  # local: evaluation imports models
    if sequence_logits is None:
      return language_model.LanguageModelEvaluator()
    return language_model.LanguageModelEvaluator(sequence_logits=sequence_logits)
  return make


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family.

  * ``config_cls``: its frozen config dataclass (with a ``family`` class attribute = ``name``);
    ``module_cls(config)`` is the Linen module.
  * ``loss(apply_fn, params, batch, *, rng, step, mutable, train) -> (loss, metrics,
    new_mutable)``: see ``lpcjax.losses``. Default: next-token cross-entropy.
  * ``example_inputs(data_config)``: the positional arguments of ``module.init`` (a batch of
    one, any pytree of any dtypes). Default: int32 tokens [1, seq_len].
  * ``data_kinds``: the ``data.kind`` values it reads; ``check(experiment_config)`` raises a
    ConfigError on an impossible model/data pairing (default: the vocabulary covers the data's).
  * ``mutable``: variable collections the model updates in training (e.g. ``("batch_stats",)``);
    they live in the TrainState and are sharded, checkpointed and restored like the params.
  * ``rng_streams``: the rng names the model draws from at init (e.g. ``("dropout",)``).
  * ``throughput_unit`` and ``units_per_example(config)``: what the progress bar counts.
  * ``evaluator()``: a factory of the object eval.py runs (``lpcjax.evaluation.Evaluator``).
  * ``init_cache(config, batch, max_len)``: for families that decode token by token
    (``lpcjax.generation``), an empty cache that ``module.apply(params, tokens, segment_ids,
    cache)`` prefills and then extends one token at a time; None: no cached decoding.
  """

  name: str
  config_cls: type
  module_cls: type
  loss: Callable = lm_loss
  example_inputs: Callable = token_inputs
  data_kinds: tuple = LM_DATA_KINDS
  check: Callable = check_vocab
  mutable: tuple = ()
  rng_streams: tuple = ()
  throughput_unit: str = "tokens"
  units_per_example: Callable = lambda config: config.data.seq_len
  evaluator: Callable[[], Any] = language_model_evaluator()
  init_cache: Optional[Callable] = None

  def build(self, config):
    if not isinstance(config, self.config_cls):
      raise TypeError(f"family {self.name!r} needs a {self.config_cls.__name__}, got {type(config).__name__}")
    return self.module_cls(config)


_FAMILIES = Registry("model.family", "model family")
get, names = _FAMILIES.get, _FAMILIES.names


def register(family):
  return _FAMILIES.register(family.name, family)
