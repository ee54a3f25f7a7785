"""The family contract (the table of families is ``lpcjax.models.table``).

The family is the one place that knows what its model reads, how it is scored and evaluated,
so that train.py and eval.py never branch on the family. ``Family`` is neutral: it names what
every family must say and has no defaults that belong to one kind of model. The language
models' defaults (token inputs, next-token loss, the backend check, the per-token evaluator)
are in ``lpcjax.models.language_model``; see docs/adding_a_family.md.
"""

import dataclasses
from typing import Callable, Optional

import jax

from lpcjax.config import ConfigError, family_name

from .table import get, names, register, source_of  # noqa: F401  (re-exported: where they were)


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family.

  * ``config_cls``: its frozen config dataclass, a subclass of ``lpcjax.config.ModelConfig``
    whose ``family`` class attribute is ``name``; ``module_cls(config)`` is the Linen module.
  * ``loss(apply_fn, params, batch, *, rng, step, mutable, train) -> (loss, metrics,
    new_mutable)``: see ``lpcjax.losses``.
  * ``example_inputs(data_config)``: the positional arguments of ``module.init`` (a batch of
    one, any pytree of any dtypes).
  * ``check(experiment_config)``: raises a ConfigError on what only the family's code can
    judge (whether its kernels' backends support the model); run when a run starts (train.py,
    --compile-for, eval.py), after JAX loads. What the config alone decides (the data kinds it
    reads, its train class, its pairing with the data) is on ``config_cls`` (``ModelConfig``:
    ``data_kinds``, ``train_config_cls``, ``check_experiment``), checked before JAX loads;
    ``data_kinds`` and ``train_config_cls`` are read through the family too.
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
  evaluator: Callable  # () -> an lpcjax.evaluation.Evaluator
  check: Callable = lambda experiment_config: None
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
  upgrade_saved: Callable[[dict], dict] = lambda values: values
  past_training_length: Optional[str] = None

  def __post_init__(self):
    declared = family_name(self.config_cls, field=f"family {self.name!r}")
    if declared != self.name:
      raise ConfigError(f"family {self.name!r}: its config class {self.config_cls.__name__} names family "
                        f"{declared!r}; the class attribute family must be the registered name, {self.name!r}")
    if not self.config_cls.data_kinds:
      raise ConfigError(f"family {self.name!r}: its config class {self.config_cls.__name__} names no data kinds; "
                        "give it data_kinds: ClassVar[tuple] = (KIND, ...), or subclass "
                        "lpcjax.models.LanguageModelConfig (tokens: the recall tasks, text, token files)")

  @property
  def data_kinds(self):
    """The ``data.kind`` values the family reads (its config class's)."""
    return self.config_cls.data_kinds

  @property
  def train_config_cls(self):
    """The class of the ``train`` section (its config class's): ``TrainConfig``, or a subclass
    adding the family's optimizer settings (parameter groups, per-parameter learning-rate
    scales), so that the shared ``TrainConfig`` holds nothing of one family."""
    return self.config_cls.train_config_cls

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


_DATACLASS_INIT = Family.__init__


def _init(self, *args, data_kinds=None, train_config_cls=None, **fields):
  """The dataclass's __init__, with one line for the fields that moved to the config class (a
  family written for lpcjax before 2026-12-06)."""
  if data_kinds is not None or train_config_cls is not None:
    raise ConfigError("Family: data_kinds and train_config_cls are now class attributes of the family's config "
                      "class (ModelConfig.data_kinds, ModelConfig.train_config_cls; a language model's config "
                      "subclasses lpcjax.models.LanguageModelConfig): docs/adding_a_family.md")
  _DATACLASS_INIT(self, *args, **fields)


Family.__init__ = _init
