"""Typed, frozen experiment configs; experiment files; command-line overrides; JSON round trip.

An experiment is ``ExperimentConfig(model=<family config>, data=DataConfig, train=TrainConfig)``.
Experiment files in ``configs/`` define ``get_config() -> ExperimentConfig``. Any field can be
overridden from the command line as ``section.field=value`` (``model.d_model=256``,
``data.train_files=a.txt,b.txt``); ``model.family=NAME`` switches the family and
``data.kind=NAME`` the data kind, keeping the fields both classes share. Unknown keys, unparsable values and impossible combinations fail
at start with a ``ConfigError`` that names the field.
"""

import dataclasses
import importlib.util
import json
import os
import sys
import types
import typing
from typing import ClassVar, Optional


class ConfigError(ValueError):
  """A config field is unknown, has the wrong type, or conflicts with another field."""


def require(condition, field, message):
  if not condition:
    raise ConfigError(f"{field}: {message}")


def require_choice(value, field, choices):
  require(value in choices, field, f"must be one of {sorted(choices)}, got {value!r}")


# ----------------------------------------------------------------------------- data and training


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


def _default_data():
  from lpcjax.data.mqar import MQARDataConfig  # local: lpcjax.data imports this module
  return MQARDataConfig()


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
  checkpoint_every: int = 0  # 0: only at the end (and on SIGTERM/SIGINT)
  keep_checkpoints: int = 3
  max_nonfinite_steps: int = 10  # stop after this many non-finite losses in a row
  grad_accum_steps: int = 1  # micro-batches per step (data.batch_size is the whole step)
  tensorboard: bool = False  # also write TensorBoard event files (needs the [tensorboard] extra)
  # Device mesh ("data", "fsdp", "tensor"); -1 takes all devices left over by the others.
  mesh_data: int = -1
  mesh_fsdp: int = 1
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
    require(self.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", "must be >= 1")
    require(self.grad_accum_steps >= 1, "train.grad_accum_steps", "must be >= 1")
    for name in ("mesh_data", "mesh_fsdp", "mesh_tensor"):
      value = getattr(self, name)
      require(value == -1 or value >= 1, f"train.{name}", f"must be >= 1 or -1 (all remaining), got {value}")
    require([self.mesh_data, self.mesh_fsdp, self.mesh_tensor].count(-1) <= 1, "train.mesh_data",
            "at most one mesh axis can be -1")
    for rule in self.logical_rules:
      require(rule.count("=") == 1 and rule.split("=")[0], "train.logical_rules",
              f"expected 'logical=mesh_axis[+mesh_axis]' or 'logical=none', got {rule!r}")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  model: typing.Any  # a family config from lpcjax.models
  data: DataConfig = dataclasses.field(default_factory=_default_data)  # a kind from lpcjax.data
  train: TrainConfig = TrainConfig()
  name: str = "experiment"

  def __post_init__(self):
    from lpcjax import models  # local: models imports this module
    family = getattr(self.model, "family", None)
    require(family is not None, "model", "must be a model family config from lpcjax.models")
    require(isinstance(self.data, DataConfig) and self.data.kind, "data",
            "must be a data config from lpcjax.data (one class per data.kind)")
    spec = models.get(family)
    require(self.data.kind in spec.data_kinds, "data.kind",
            f"the {family} family reads {' or '.join(spec.data_kinds)}, not {self.data.kind!r}")
    spec.check(self)
    require(self.data.batch_size % self.train.grad_accum_steps == 0, "train.grad_accum_steps",
            f"data.batch_size={self.data.batch_size} is not divisible by {self.train.grad_accum_steps}")


# ----------------------------------------------------------------------------- overrides


def _parse_value(text, annotation, field):
  origin = typing.get_origin(annotation)
  args = typing.get_args(annotation)
  if origin in (typing.Union, types.UnionType):
    if text.lower() in ("none", "null") and type(None) in args:
      return None
    (inner,) = [a for a in args if a is not type(None)]
    return _parse_value(text, inner, field)
  if origin is tuple:
    return tuple(_parse_value(part, args[0], field) for part in text.split(",") if part)
  if annotation is bool:
    lowered = text.lower()
    require(lowered in ("true", "false", "1", "0", "yes", "no"), field,
            f"expected a boolean, got {text!r}")
    return lowered in ("true", "1", "yes")
  if annotation in (int, float):
    try:
      return annotation(text)
    except ValueError:
      raise ConfigError(f"{field}: expected {annotation.__name__}, got {text!r}") from None
  return text


def _field_types(cls):
  return typing.get_type_hints(cls)


def _selector(obj):
  """'model.family=fox' / 'data.kind=mqar': what decides which fields a section has."""
  if hasattr(obj, "family"):
    return f"model.family={obj.family!r}"
  return f"data.kind={obj.kind!r}"


def replace_fields(obj, values, prefix):
  """dataclasses.replace with string values parsed by each field's type; names unknown keys."""
  types_ = {name: t for name, t in _field_types(type(obj)).items() if typing.get_origin(t) is not ClassVar}
  parsed = {}
  for key, text in values.items():
    field = f"{prefix}.{key}"
    if key not in types_:
      raise ConfigError(f"{field}: unknown key for {_selector(obj)}; known keys are {sorted(types_)}")
    parsed[key] = _parse_value(text, types_[key], field) if isinstance(text, str) else text
  return dataclasses.replace(obj, **parsed)


def switch_class(obj, target):
  """An instance of ``target`` keeping the fields of ``obj`` that ``target`` also has and that
  differ from their defaults (``model.family=NAME``, ``data.kind=NAME``)."""
  target_fields = {f.name for f in dataclasses.fields(target)}
  kept = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
          if f.name in target_fields and getattr(obj, f.name) != f.default}
  return target(**kept)


def switch_family(model_config, family_name):
  from lpcjax import models  # local: models imports this module
  return switch_class(model_config, models.get(family_name).config_cls)


def switch_kind(data_config, kind):
  from lpcjax import data  # local: lpcjax.data imports this module
  return switch_class(data_config, data.get(kind).config_cls)


def apply_overrides(config, overrides):
  """Apply ``["model.d_model=128", ...]`` to an ExperimentConfig and re-validate it."""
  sections = {"model": {}, "data": {}, "train": {}}
  top = {}
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r}: expected section.field=value")
    key, value = item.split("=", 1)
    section, _, field = key.partition(".")
    if section in sections and field:
      sections[section][field] = value
    elif key == "name":
      top["name"] = value
    else:
      raise ConfigError(f"{key}: unknown key; use model.*, data.*, train.* or name")
  model, data = config.model, config.data
  family = sections["model"].pop("family", None)
  if family is not None:
    model = switch_family(model, family)
  kind = sections["data"].pop("kind", None)
  if kind is not None:
    data = switch_kind(data, kind)
  model = replace_fields(model, sections["model"], "model")
  data = replace_fields(data, sections["data"], "data")
  train = replace_fields(config.train, _fit_warmup(config.train, sections["train"]), "train")
  return dataclasses.replace(config, model=model, data=data, train=train, **top)


def _fit_warmup(train, values):
  """``train.steps=N`` below the experiment's warm-up, with no ``train.warmup_steps`` given (a
  smoke test of a long recipe): the warm-up keeps its share of the run, with a one-line notice
  on stderr, rather than fail validation. An explicit warm-up longer than the run still fails."""
  if "steps" not in values or "warmup_steps" in values:
    return values
  steps = values["steps"]
  if isinstance(steps, str):
    steps = _parse_value(steps, _field_types(TrainConfig)["steps"], "train.steps")
  if not 1 <= steps < train.warmup_steps:
    return values
  warmup = min(steps, round(train.warmup_steps * steps / train.steps))
  print(f"note: train.steps={steps} is shorter than the warm-up of {train.warmup_steps} steps: "
        f"train.warmup_steps={warmup} (set it to choose another)", file=sys.stderr)
  return {**values, "warmup_steps": warmup}


# ----------------------------------------------------------------------------- files and JSON


def load_experiment(path_or_name, search_dir="configs"):
  """Load ``get_config()`` from a Python file, or from ``configs/<name>.py``.

  ``file:arg`` (as in ml_collections) calls ``get_config("arg")``: ``paper:fox_pro_760m``.
  """
  path_or_name, _, argument = path_or_name.partition(":")
  path = path_or_name
  if not os.path.exists(path):
    candidate = os.path.join(search_dir, f"{path_or_name}.py")
    if not os.path.exists(candidate):
      raise ConfigError(f"config {path_or_name!r}: no such file (also looked for {candidate})")
    path = candidate
  spec = importlib.util.spec_from_file_location(f"lpcjax_experiment_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config {path}: defines no get_config()")
  try:
    config = module.get_config(argument) if argument else module.get_config()
  except (KeyError, ValueError) as error:
    if isinstance(error, ConfigError):
      raise
    raise ConfigError(f"config {path}:{argument}: {error!r}") from None
  if not isinstance(config, ExperimentConfig):
    raise ConfigError(f"config {path}: get_config() must return an ExperimentConfig")
  return config


def to_dict(config):
  out = dataclasses.asdict(config)
  out["model"] = {"family": config.model.family, **out["model"]}
  out["data"] = {"kind": config.data.kind, **out["data"]}
  return out


# Before data kinds had their own classes (lpcjax <= 0.1 run directories), every data section
# held every kind's fields. Loading such a config.json drops the other kinds' fields when they
# hold these old defaults; any other value is an error, since it would be silently ignored.
_FLAT_DATA_DEFAULTS = {"mqar_vocab_size": 8192, "mqar_num_pairs": 16, "mqar_gap_power": 0.1,
                       "train_files": [], "eval_files": [], "tokenizer_file": None, "train_tokens": None,
                       "eval_tokens": None, "segment_ids": False, "window_stride": None}


def from_dict(values):
  """Rebuild an ExperimentConfig from ``to_dict`` output (e.g. a run's config.json)."""
  from lpcjax import data, models
  model_values, data_values = dict(values["model"]), dict(values["data"])
  family = models.get(model_values.pop("family"))
  kind = data.get(data_values.pop("kind", "mqar"))
  data_fields = _field_types(kind.config_cls)
  for key in [k for k in data_values if k not in data_fields]:
    if _FLAT_DATA_DEFAULTS.get(key, object()) == data_values[key]:
      del data_values[key]

  def build(cls, raw, prefix):
    known = _field_types(cls)
    unknown = set(raw) - set(known)
    if unknown:
      raise ConfigError(f"{prefix}.{sorted(unknown)[0]}: unknown key in saved config")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})

  return ExperimentConfig(model=build(family.config_cls, model_values, "model"),
                          data=build(kind.config_cls, data_values, "data"),
                          train=build(TrainConfig, values["train"], "train"),
                          name=values.get("name", "experiment"))


def to_json(config):
  return json.dumps(to_dict(config), indent=2, sort_keys=True)
