"""Typed, frozen experiment configs; experiment files; command-line overrides; JSON round trip.

An experiment is ``ExperimentConfig(model=<family config>, data=DataConfig, train=TrainConfig)``.
Experiment files in ``configs/`` define ``get_config() -> ExperimentConfig``. Any field can be
overridden from the command line as ``section.field=value`` (``model.d_model=256``,
``data.train_files=a.txt,b.txt``); ``model.family=NAME`` switches the family and keeps the
fields both families share. Unknown keys, unparsable values and impossible combinations fail
at start with a ``ConfigError`` that names the field.
"""

import dataclasses
import importlib.util
import json
import os
import types
import typing
from typing import Optional


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
  """Where batches come from.

  kind="mqar": multi-query associative recall, generated on the fly (no download).
  kind="text": text files (.txt, .gz, .jsonl) tokenized in memory with the GPT-2 tokenizer.
  kind="tokens": a token file made by ``python -m lpcjax.data`` (memmapped).
  """

  kind: str = "mqar"
  seq_len: int = 256
  batch_size: int = 32
  # mqar: keys from [1, vocab/2), values from [vocab/2, vocab); token 0 fills the gaps.
  mqar_vocab_size: int = 8192
  mqar_num_pairs: int = 16
  mqar_gap_power: float = 0.1  # query gaps drawn with p(gap) ∝ gap^(power - 1), as in Zoology
  # text
  train_files: tuple[str, ...] = ()
  eval_files: tuple[str, ...] = ()
  tokenizer_file: Optional[str] = None  # tiktoken rank file; else $LPCJAX_TIKTOKEN_FILE; else download
  # tokens
  train_tokens: Optional[str] = None  # prefix of PREFIX.bin/PREFIX.json
  eval_tokens: Optional[str] = None
  segment_ids: bool = False  # text/tokens: give the model document boundaries inside a window
  window_stride: Optional[int] = None  # text/tokens: start of window i is i * stride (default seq_len)

  def __post_init__(self):
    require_choice(self.kind, "data.kind", {"mqar", "text", "tokens"})
    require(self.seq_len >= 2, "data.seq_len", f"must be >= 2, got {self.seq_len}")
    require(self.batch_size >= 1, "data.batch_size", f"must be >= 1, got {self.batch_size}")
    require(self.window_stride is None or self.window_stride >= 1, "data.window_stride", "must be >= 1")
    if self.kind == "mqar":
      require(self.mqar_vocab_size >= 4, "data.mqar_vocab_size", "must be >= 4")
      require(self.mqar_num_pairs >= 1, "data.mqar_num_pairs", "must be >= 1")
      require(4 * self.mqar_num_pairs <= self.seq_len, "data.mqar_num_pairs",
              f"{self.mqar_num_pairs} pairs and their queries need seq_len >= {4 * self.mqar_num_pairs}")
      require(self.mqar_num_pairs < self.mqar_vocab_size // 2, "data.mqar_num_pairs",
              "needs fewer pairs than keys (mqar_vocab_size / 2)")


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
  eval_batches: int = 8
  run_dir: str = "runs"
  run_name: Optional[str] = None  # default: <config name>-<time>
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
  data: DataConfig = DataConfig()
  train: TrainConfig = TrainConfig()
  name: str = "experiment"

  def __post_init__(self):
    family = getattr(self.model, "family", None)
    require(family is not None, "model", "must be a model family config from lpcjax.models")
    if self.data.kind == "mqar":
      require(self.model.vocab_size >= self.data.mqar_vocab_size, "model.vocab_size",
              f"{self.model.vocab_size} is smaller than data.mqar_vocab_size={self.data.mqar_vocab_size}")
    else:
      require(self.model.vocab_size >= 50257, "model.vocab_size",
              f"GPT-2 text needs >= 50257 tokens, got {self.model.vocab_size}")
    window_len = getattr(self.model, "window_len", None)  # families that read fixed windows
    if window_len is not None:
      require(self.data.seq_len == window_len, "data.seq_len",
              f"the {family} model reads windows of {window_len} tokens, got {self.data.seq_len}")
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


def replace_fields(obj, values, prefix):
  """dataclasses.replace with string values parsed by each field's type; names unknown keys."""
  types_ = _field_types(type(obj))
  parsed = {}
  for key, text in values.items():
    field = f"{prefix}.{key}"
    if key not in types_:
      raise ConfigError(f"{field}: unknown key; known keys are {sorted(types_)}")
    parsed[key] = _parse_value(text, types_[key], field) if isinstance(text, str) else text
  return dataclasses.replace(obj, **parsed)


def switch_family(model_config, family_name):
  """The same shared fields in another family's config class."""
  from lpcjax import models  # local: models imports this module
  target = models.get(family_name).config_cls
  target_fields = {f.name for f in dataclasses.fields(target)}
  kept = {f.name: getattr(model_config, f.name) for f in dataclasses.fields(model_config)
          if f.name in target_fields and getattr(model_config, f.name) != f.default}
  return target(**kept)


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
  model = config.model
  family = sections["model"].pop("family", None)
  if family is not None:
    model = switch_family(model, family)
  model = replace_fields(model, sections["model"], "model")
  data = replace_fields(config.data, sections["data"], "data")
  train = replace_fields(config.train, sections["train"], "train")
  return dataclasses.replace(config, model=model, data=data, train=train, **top)


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
  return out


def from_dict(values):
  """Rebuild an ExperimentConfig from ``to_dict`` output (e.g. a run's config.json)."""
  from lpcjax import models
  model_values = dict(values["model"])
  family = models.get(model_values.pop("family"))

  def build(cls, raw, prefix):
    known = _field_types(cls)
    unknown = set(raw) - set(known)
    if unknown:
      raise ConfigError(f"{prefix}.{sorted(unknown)[0]}: unknown key in saved config")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})

  return ExperimentConfig(model=build(family.config_cls, model_values, "model"),
                          data=build(DataConfig, values["data"], "data"),
                          train=build(TrainConfig, values["train"], "train"),
                          name=values.get("name", "experiment"))


def to_json(config):
  return json.dumps(to_dict(config), indent=2, sort_keys=True)
