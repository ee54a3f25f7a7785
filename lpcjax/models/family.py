"""The family contract and the table of families: ``lpcjax.models.get("fox")``.

The family is the one place that knows what its model reads, how it is scored and evaluated,
so that train.py and eval.py never branch on the family. ``Family`` is neutral: it names what
every family must say and has no defaults that belong to one kind of model. The language
models' defaults (token inputs, next-token loss, vocabulary check, the per-token evaluator)
are in ``lpcjax.models.language_model``; see docs/adding_a_family.md.
"""

import dataclasses
from typing import Callable, Optional

import jax

from lpcjax.config import ConfigError, TrainConfig, family_name
from lpcjax.evaluation.protocol import Evaluator
from lpcjax.registry import Registry, caller_source


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family.

  * ``config_cls``: its frozen config dataclass, a subclass of ``lpcjax.config.ModelConfig``
    whose ``family`` class attribute is ``name``; ``module_cls(config)`` is the Linen module.
  * ``loss(apply_fn, params, batch, *, rng, step, mutable, train) -> (loss, metrics,
    new_mutable)``: see ``lpcjax.losses``.
  * ``example_inputs(data_config)``: the positional arguments of ``module.init`` (a batch of
    one, any pytree of any dtypes).
  * ``data_kinds``: the ``data.kind`` values it reads; ``check(experiment_config)`` raises a
    ConfigError on an impossible model/data pairing.
  * ``evaluator()``: a factory of the object eval.py runs (``lpcjax.evaluation.Evaluator``).
  * ``mutable``: variable collections the model updates in training (e.g. ``("batch_stats",)``);
    they live in the TrainState and are sharded, checkpointed and restored like the params.
  * ``rng_streams``: the rng names the model draws from at init (e.g. ``("dropout",)``).
  * ``throughput_unit`` and ``units_per_example(config)``: what the progress bar counts;
    ``flops_per_unit(config, params)``: the model's training FLOPs per such unit, from which
    the trainer logs MFU (None, or a function returning None: MFU is not logged, and the
    trainer's start block says so once).
  * ``init_cache(config, batch, max_len)``: for families that decode token by token
    (``lpcjax.decoding``), an empty cache that ``module.apply(params, tokens, segment_ids,
    cache)`` prefills and then extends one token at a time; None: no cached decoding, and
    ``no_decoding_reason`` says why (``generate`` prints it).
  * ``prefill(model, params, tokens, segment_ids, cache, lengths) -> (last logits [batch,
    vocab], cache)``: how a cache that a parallel pass cannot fill takes the right-padded
    prompts (``lpcjax.decoding.prefill_by_steps``); None: ``module.apply`` with the cache.
  * ``stop_rule``: the family's own way for a generated row to end besides the end token (a
    ``lpcjax.decoding.StopRule``: its flags of ``python -m lpcjax.generate`` and the function of
    the decoding cache that ends a row; LPC-SM's stop head), or None.
  * ``context_parallel``: whether the model may run with its sequence sharded over the mesh's
    "context" axis (``train.mesh_context``): every op that mixes positions is either attention
    (context-parallel) or partitioned correctly by GSPMD without gathering the sequence. A
    recurrence along the sequence (a scan) is not, so such families say False.
  * ``train_config_cls``: the class of the ``train`` section, ``TrainConfig`` or a subclass
    adding the family's optimizer settings (parameter groups, per-parameter learning-rate
    scales: ``TrainConfig.parameter_groups`` and ``lr_scale_rules``), so that the shared
    ``TrainConfig`` holds nothing of one family.
  * ``upgrade_saved(values) -> values``: a config.json written by an older lpcjax (a dict with
    ``model``, ``data``, ``train``) brought to the current fields, so that old runs still load.
  * ``past_training_length``: what the family was measured to do on sequences longer than it
    was trained on, one sentence with where the measurement is, or None (not measured);
    ``python -m lpcjax.generate`` says it when a prompt and its new tokens pass the run's
    training length.
  """

  name: str
  config_cls: type
  module_cls: type
  loss: Callable
  example_inputs: Callable
  data_kinds: tuple
  check: Callable
  evaluator: Callable[[], Evaluator]
  mutable: tuple = ()
  rng_streams: tuple = ()
  throughput_unit: str = "examples"
  units_per_example: Callable = lambda config: 1
  flops_per_unit: Optional[Callable] = None
  init_cache: Optional[Callable] = None
  prefill: Optional[Callable] = None
  no_decoding_reason: str = "its family registers no decoding cache"
  stop_rule: Optional[object] = None
  context_parallel: bool = False
  train_config_cls: type = TrainConfig
  upgrade_saved: Callable[[dict], dict] = lambda values: values
  past_training_length: Optional[str] = None

  def __post_init__(self):
    declared = family_name(self.config_cls, field=f"family {self.name!r}")
    if declared != self.name:
      raise ConfigError(f"family {self.name!r}: its config class {self.config_cls.__name__} names family "
                        f"{declared!r}; the class attribute family must be the registered name, {self.name!r}")

  def build(self, config):
    if not isinstance(config, self.config_cls):
      raise TypeError(f"family {self.name!r} needs a {self.config_cls.__name__}, got {type(config).__name__}")
    return self.module_cls(config)

  def init_variables(self, model, data_config, seed):
    """The model's boxed variables (params and mutable collections), from the example inputs.
    The params key is PRNGKey(seed); the other rng streams are folded from it."""
    key = jax.random.PRNGKey(seed)
    rngs = {"params": key, **{name: jax.random.fold_in(key, i + 1) for i, name in enumerate(self.rng_streams)}}
    config = model.config
    if getattr(config, "debug_checks", False):  # value checks belong to apply, not init
      model = model.clone(config=dataclasses.replace(config, debug_checks=False))
    return model.init(rngs, *self.example_inputs(data_config))


_FAMILIES = Registry("model.family", "model family")
get, names, source_of = _FAMILIES.get, _FAMILIES.names, _FAMILIES.source_of


def register(family):
  """Add ``family`` to the table, remembering the calling module: runs record it, so that a
  fresh eval.py imports a family defined outside the package (``get(name, source)``)."""
  return _FAMILIES.register(family.name, family, caller_source())
