"""The config schema, on the ground floor: it imports nothing of lpcjax but ``lpcjax.errors``.

Here: ``ConfigError`` and the ``require`` checks every config uses, the bases of the family
configs (``ModelConfig``) and of the data kinds' configs (``DataConfig``), the trainer's
``TrainConfig``, and the typed parsing of one section's ``field=value`` strings
(``replace_fields``). What puts a family config, a data config and a
``TrainConfig`` together into an experiment, resolves ``model.family`` / ``data.kind`` through
the registries, loads experiment files and round-trips JSON is one floor up, in
``lpcjax.experiment``.
"""

import dataclasses
import difflib
import os
import types
import typing
from typing import ClassVar, Optional

from lpcjax.errors import ConfigError

__all__ = ["ConfigError", "DataConfig", "ParameterGroup", "TrainConfig", "check_parameter_group",
           "check_scale_rules", "did_you_mean", "field_types", "parse_value", "replace_fields", "require",
           "require_choice", "switch_class"]


def require(condition, field, message):
  if not condition:
    raise ConfigError(f"{field}: {message}")


def did_you_mean(name, known, prefix="", suffix="", n=1):
  """' (did you mean PREFIX+CLOSEST+SUFFIX?)' for a mistyped ``name`` (the ``n`` closest of
  ``known``, by difflib), or '' when nothing is close."""
  close = difflib.get_close_matches(name, list(known), n=n)
  return f" (did you mean {' or '.join(prefix + c + suffix for c in close)}?)" if close else ""


def require_choice(value, field, choices):
  require(value in choices, field, f"must be one of {sorted(choices)}, got {value!r}")


# ----------------------------------------------------------------------------- model, data and training


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The fields every data kind has. Each kind (``data.kind``) is a subclass registered in
  ``lpcjax.data`` with its own fields and checks: ``mqar``, ``text``, ``tokens``, and whatever a
  family registers (see ``lpcjax.data.register``). ``seq_len`` is the length of one example
  (tokens for language models, time steps for series)."""

  kind: ClassVar[str] = ""

  seq_len: int = 256
  batch_size: int = 32

  def __post_init__(self):
    require(self.seq_len >= 2, "data.seq_len", f"must be >= 2, got {self.seq_len}")
    require(self.batch_size >= 1, "data.batch_size", f"must be >= 1, got {self.batch_size}")

  # What the language-model evaluator asks of its data; each kind answers for itself, so the
  # evaluator never branches on the kind. Defaults: a finite set of independent sequences with
  # no text behind them.
  is_text_stream: ClassVar[bool] = False  # sequences cut from one text stream (rolled in eval)
  scores_recall: ClassVar[bool] = False  # examples mark key-query pairs (recall by distance)
  scores_answers: ClassVar[bool] = False  # generated: accuracy at the answers by bucket, a test split
  default_eval_examples: ClassVar[Optional[int]] = None  # None: every example of a finite set
  missing_file_hint: ClassVar[str] = ""  # said after "no such file: PATH" (check_input_files)

  def for_evaluation(self, seq_len, batch_size):
    """This data at the evaluation's sequence length and batch size."""
    return dataclasses.replace(self, seq_len=seq_len, batch_size=batch_size)

  def tokens_per_word(self):
    """Tokens per whitespace-separated word of the evaluation text (word perplexity), or None."""
    return None

  def text_tokens(self, tokenizer):
    """The evaluation (else training) text as tokens, for the text probes; None: no text."""
    return None

  def check_tokenizer(self):
    """Raise a DataError if the data was made with another tokenizer than the one configured."""

  def input_files(self):
    """[(field, path)]: the files this data reads, so that a command line finds a missing one
    before JAX loads (``check_input_files``); none by default (generated data)."""
    return []

  def check_input_files(self):
    """A one-line ConfigError naming the field of the first input file that is not there."""
    for field, path in self.input_files():
      require(os.path.isfile(path), field, f"no such file: {path}{self.missing_file_hint}")

  def evaluation_data(self):
    """What an evaluation of this data scores, in words: the start block, summary.json and
    eval.py say it, and a kind that evaluates on its training data says so plainly."""
    return f"the {self.kind} data's held-out split"


def listed(names, most=3, sep=", "):
  """Up to ``most`` names joined by ``sep``, then how many more: for a line that names files
  (``sep=","``: as an override writes them)."""
  more = f" (+{len(names) - most} more)" if len(names) > most else ""
  return sep.join(map(str, names[:most])) + more


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimizer, schedule and bookkeeping. Defaults follow the FoX paper's recipe (AdamW)."""

  steps: int = 1000
  learning_rate: float = 2e-3
  warmup_steps: int = 100
  min_learning_rate: float = 0.0  # cosine decays to this
  weight_decay: float = 0.1  # on kernels and embeddings only
  adam_b1: float = 0.9
  adam_b2: float = 0.95
  grad_clip: float = 1.0
  seed: int = 0
  log_every: int = 25
  eval_every: int = 0  # 0: evaluate only at the end
  eval_batches: int = 8  # at most this many eval batches; 0: all of a finite eval set
  run_dir: str = "runs"
  run_name: Optional[str] = None  # default: <config name>-<time>
  # RUN_DIR or RUN_DIR:STEP: start from that run's params (and mutable collections such as
  # batch_stats), not its optimizer state or data position: fine-tuning and staged schedules.
  init_from: Optional[str] = None
  # With --resume: the checkpoint step to continue (None: the latest), e.g. the previous step
  # when the latest is damaged. Later steps are set aside under RUN/checkpoints_set_aside/, not deleted.
  resume_step: Optional[int] = None
  checkpoint_every: int = 0  # 0: only at the end (and on SIGTERM/SIGINT)
  keep_checkpoints: int = 3
  max_nonfinite_steps: int = 10  # stop after this many non-finite losses in a row
  grad_accum_steps: int = 1  # micro-batches per step (data.batch_size is the whole step)
  tensorboard: bool = False  # also write TensorBoard event files (needs the [tensorboard] extra)
  # Peak TFLOP/s of one device, for the logged MFU; None: known accelerators only (H100, H200, A100)
  peak_tflops: Optional[float] = None
  # Device mesh ("data", "fsdp", "context", "tensor"); -1 takes all devices left over by the
  # others. mesh_context > 1 shards the sequence (context parallelism; docs/training.md).
  mesh_data: int = -1
  mesh_fsdp: int = 1
  mesh_context: int = 1
  mesh_tensor: int = 1
  # Logical-axis rules as "logical=mesh_axis[+mesh_axis]" or "logical=none"; they replace the
  # matching entries of lpcjax.sharding.DEFAULT_RULES.
  logical_rules: tuple[str, ...] = ()

  def __post_init__(self):
    require(self.steps >= 1, "train.steps", f"must be >= 1, got {self.steps}")
    require(self.learning_rate > 0, "train.learning_rate", "must be > 0")
    require(0 <= self.warmup_steps <= self.steps, "train.warmup_steps",
            f"must be in [0, train.steps={self.steps}], got {self.warmup_steps}")
    require(0 <= self.min_learning_rate <= self.learning_rate, "train.min_learning_rate",
            "must be in [0, learning_rate]")
    require(self.grad_clip > 0, "train.grad_clip", "must be > 0")
    require(self.log_every >= 1, "train.log_every", "must be >= 1")
    require(self.eval_every >= 0, "train.eval_every", "must be >= 0")
    require(self.eval_batches >= 0, "train.eval_batches", "must be >= 0 (0: all of a finite eval set)")
    require(self.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0")
    require(self.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")
    require(self.resume_step is None or 0 < self.resume_step <= self.steps, "train.resume_step",
            f"must be a checkpoint step in [1, train.steps={self.steps}], got {self.resume_step}")
    require(self.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", "must be >= 1")
    require(self.grad_accum_steps >= 1, "train.grad_accum_steps", "must be >= 1")
    require(self.peak_tflops is None or self.peak_tflops > 0, "train.peak_tflops", "must be > 0 (or none)")
    mesh = [self.mesh_data, self.mesh_fsdp, self.mesh_context, self.mesh_tensor]
    for name, value in zip(("mesh_data", "mesh_fsdp", "mesh_context", "mesh_tensor"), mesh):
      require(value == -1 or value >= 1, f"train.{name}", f"must be >= 1 or -1 (all remaining), got {value}")
    require(mesh.count(-1) <= 1, "train.mesh_data",
            "at most one mesh axis can be -1")
    for rule in self.logical_rules:
      require(rule.count("=") == 1 and rule.split("=")[0], "train.logical_rules",
              f"expected 'logical=mesh_axis[+mesh_axis]' or 'logical=none', got {rule!r}")

  # What a family's optimizer adds to the shared AdamW (``lpcjax.training.make_optimizer``): a
  # family that needs more declares a subclass with its own fields (``Family.train_config_cls``)
  # and overrides these two. Nothing here: the optimizer of every other family stays exactly
  # as it is (and so do the structures of their checkpointed optimizer states).
  def parameter_groups(self):
    """The ``ParameterGroup``s optimized apart from the rest (first match wins)."""
    return ()

  def lr_scale_rules(self):
    """Per-parameter learning-rate scales as "PATTERN=FACTOR" (see ``check_scale_rules``)."""
    return ()


@dataclasses.dataclass(frozen=True)
class LRScaledTrainConfig(TrainConfig):
  """``TrainConfig`` plus per-parameter learning-rate scales: the one way a family scales the
  updates of some of its parameters (LPC-SM's controller, PMT's gates). A family whose
  optimizer needs them uses this class, or a subclass adding its own settings, as its
  ``Family.train_config_cls``."""

  # "PATTERN=FACTOR": the updates of every parameter whose '/'-joined path (e.g.
  # layers/controller/ratio_logit) contains PATTERN are multiplied by FACTOR (the first matching
  # rule wins). Empty: the optimizer is exactly the shared one.
  lr_scales: tuple[str, ...] = ()

  def __post_init__(self):
    super().__post_init__()
    check_scale_rules(self.lr_scales, "train.lr_scales")

  def lr_scale_rules(self):
    return self.lr_scales


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The base of every family's config (the ``model`` section). A subclass names the family it
  is registered as in a class attribute, ``family: ClassVar[str] = "my_family"``, which the run's
  config.json records and eval.py looks up; its fields are the family's own (``model.*``).

  A subclass also says, in class attributes and one method, what only its config decides, so
  that an experiment is checked before JAX loads (``lpcjax.experiment``): ``data_kinds``, the
  ``data.kind`` values it reads; ``train_config_cls``, the class of the ``train`` section
  (``TrainConfig`` or a subclass with the family's optimizer settings); ``check_experiment``,
  a one-line ConfigError on an impossible pairing with the data or the trainer. What needs the
  family's code (its kernels' backends) is the family's ``check`` (``lpcjax.models.Family``)."""

  family: ClassVar[str] = ""
  data_kinds: ClassVar[tuple] = ()
  train_config_cls: ClassVar[type] = TrainConfig

  def check_experiment(self, experiment):
    """Raise a ConfigError when ``experiment`` (an ExperimentConfig holding this config)
    pairs it with data or training it cannot take; nothing by default."""


def family_name(model_config, field="model"):
  """The family a model config names, or a one-line ConfigError saying how to name one."""
  name = getattr(model_config, "family", "")
  if not isinstance(name, str) or not name:
    cls = model_config if isinstance(model_config, type) else type(model_config)
    what = cls.__name__ if dataclasses.is_dataclass(cls) else f"{model_config!r} (not a dataclass)"
    raise ConfigError(f"{field}: {what} names no family; a family config subclasses lpcjax.config.ModelConfig "
                      'and names its family in a class attribute: family: ClassVar[str] = "NAME"')
  return name



@dataclasses.dataclass(frozen=True)
class ParameterGroup:
  """Parameters whose '/'-joined path (``layers/controller/ratio_logit``) contains one of
  ``patterns``, with their own global-norm clip, Adam b2 and weight decay: a group of small
  parameters whose small gradients the clipping of the large group would otherwise shrink."""

  name: str
  patterns: tuple[str, ...]
  adam_b2: float
  grad_clip: float
  weight_decay: float = 0.0


def check_parameter_group(patterns, adam_b2, grad_clip, prefix):
  """The checks of a family's ``<prefix>_patterns``, ``<prefix>_adam_b2``, ``<prefix>_grad_clip``."""
  require(grad_clip > 0 and 0 < adam_b2 < 1, f"train.{prefix}_grad_clip",
          f"{prefix}_grad_clip must be > 0 and {prefix}_adam_b2 in (0, 1)")
  require(all(patterns), f"train.{prefix}_patterns", "an empty pattern would match every parameter")


def check_scale_rules(rules, field):
  """Each rule is "PATTERN=FACTOR" with FACTOR > 0: the updates of every parameter whose path
  contains PATTERN are multiplied by FACTOR (the first matching rule wins)."""
  for rule in rules:
    pattern, _, factor = rule.partition("=")
    require(pattern and _is_positive_float(factor), field, f"expected 'PATTERN=FACTOR' with FACTOR > 0, got {rule!r}")


def _is_positive_float(text):
  try:
    return float(text) > 0
  except ValueError:
    return False


# ----------------------------------------------------------------------------- overrides


def parse_value(text, annotation, field):
  origin = typing.get_origin(annotation)
  args = typing.get_args(annotation)
  if origin in (typing.Union, types.UnionType):
    if text.lower() in ("none", "null") and type(None) in args:
      return None
    (inner,) = [a for a in args if a is not type(None)]
    return parse_value(text, inner, field)
  if origin is tuple:
    return tuple(parse_value(part, args[0], field) for part in text.split(",") if part)
  if annotation is bool:  # one spelling, the one config.json and --print-config show
    lowered = text.lower()
    require(lowered in ("true", "false"), field, f"expected a boolean (true or false), got {text!r}")
    return lowered == "true"
  if annotation in (int, float):
    try:
      return annotation(text)
    except ValueError:
      raise ConfigError(f"{field}: expected {annotation.__name__}, got {text!r}") from None
  return text


def field_types(cls):
  return typing.get_type_hints(cls)


def _selector(obj, prefix):
  """'model.family=fox' / 'data.kind=mqar': what decides which fields a section has; the
  section's name where nothing does (train)."""
  if hasattr(obj, "family"):
    return f"model.family={obj.family!r}"
  if hasattr(obj, "kind"):
    return f"data.kind={obj.kind!r}"
  return prefix


def replace_fields(obj, values, prefix):
  """dataclasses.replace with string values parsed by each field's type; names unknown keys."""
  types_ = {name: t for name, t in field_types(type(obj)).items() if typing.get_origin(t) is not ClassVar}
  parsed = {}
  for key, text in values.items():
    field = f"{prefix}.{key}"
    if key not in types_:
      raise ConfigError(f"{field}: unknown key for {_selector(obj, prefix)}{did_you_mean(key, types_, prefix + '.')}; "
                        f"known keys are {sorted(types_)}")
    parsed[key] = parse_value(text, types_[key], field) if isinstance(text, str) else text
  return dataclasses.replace(obj, **parsed)


def switch_class(obj, target):
  """An instance of ``target`` keeping the fields of ``obj`` that ``target`` also has and that
  differ from their defaults (``model.family=NAME``, ``data.kind=NAME``)."""
  target_fields = {f.name for f in dataclasses.fields(target)}
  kept = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
          if f.name in target_fields and getattr(obj, f.name) != f.default}
  return target(**kept)
