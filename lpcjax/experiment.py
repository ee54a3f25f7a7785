"""An experiment: a family config, a data config and a ``TrainConfig``, checked together.

One floor above the registries (``lpcjax.models``, ``lpcjax.data``), which it uses to resolve
``model.family`` and ``data.kind``. Experiment files in ``configs/`` define
``get_config() -> ExperimentConfig``. Any field can be overridden from the command line as
``section.field=value`` (``model.d_model=256``, ``data.train_files=a.txt,b.txt``);
``model.family=NAME`` switches the family and ``data.kind=NAME`` the data kind, keeping the
fields both classes share. Unknown keys, unparsable values and impossible combinations fail at
start with a ``ConfigError`` that names the field. ``to_dict``/``from_dict`` round-trip a run's
config.json.

Loading and checking an experiment imports no JAX (the configs and their checks are apart from
the models: ``lpcjax.models``, ``lpcjax.lazy``), so a command line answers a bad override in
about a second; what needs the family's code (its attention backend) is checked when a run
starts (``lpcjax.models.checked_family``). ``to_dict``/``from_dict`` load the family.
"""

import ast
import dataclasses
import importlib.util
import json
import os
import sys
import typing

from lpcjax import data, kernels, models
from lpcjax.config import (ConfigError, DataConfig, ModelConfig, TrainConfig, did_you_mean, family_name,
                           field_types, parse_value, replace_fields, require, switch_class)
from lpcjax.data.mqar import MQARDataConfig
from lpcjax.registry import import_source

# ConfigError, DataConfig, ModelConfig and TrainConfig live in the schema (lpcjax.config);
# re-exported so an experiment file needs one import.
__all__ = ["ConfigError", "DataConfig", "ExperimentConfig", "ModelConfig", "TrainConfig", "apply_overrides",
           "config_names", "experiment_hooks", "from_dict", "load_experiment", "switch_family", "switch_kind",
           "to_dict", "to_json", "train_for"]

@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  model: typing.Any  # a family config from lpcjax.models
  data: DataConfig = dataclasses.field(default_factory=MQARDataConfig)  # a kind from lpcjax.data
  train: TrainConfig = TrainConfig()
  name: str = "experiment"

  def __post_init__(self):
    family_name(self.model)
    require(isinstance(self.data, DataConfig) and self.data.kind, "data",
            "must be a data config from lpcjax.data (one class per data.kind)")
    model_cls = type(self.model)
    # A plain TrainConfig (what experiment files write) becomes the family's own train class.
    object.__setattr__(self, "train", train_for(model_cls, self.train))
    require(self.data.kind in model_cls.data_kinds, "data.kind",
            f"the {model_cls.family} family reads {' or '.join(model_cls.data_kinds)}, not {self.data.kind!r}")
    self.model.check_experiment(self)
    require(self.data.batch_size % self.train.grad_accum_steps == 0, "train.grad_accum_steps",
            f"data.batch_size={self.data.batch_size} is not divisible by {self.train.grad_accum_steps}")


# ----------------------------------------------------------------------------- overrides


def switch_family(model_config, family_name):
  return switch_class(model_config, models.config_class(family_name))


def switch_kind(data_config, kind):
  return switch_class(data_config, data.get(kind).config_cls)


def train_for(model_cls, train):
  """``train`` as an instance of the train class of a family's config class ``model_cls``
  (``ModelConfig.train_config_cls``), keeping every field both classes have; a setting of
  another family's optimizer is an error, not silently dropped."""
  target = model_cls.train_config_cls
  require(isinstance(train, TrainConfig), "train", "must be a TrainConfig (lpcjax.config)")
  if type(train) is target:
    return train
  names = {f.name for f in dataclasses.fields(target)}
  for f in dataclasses.fields(train):
    if f.name not in names and getattr(train, f.name) != f.default:
      raise ConfigError(f"train.{f.name}: the {model_cls.family} family's optimizer has no such setting")
  return target(**{f.name: getattr(train, f.name) for f in dataclasses.fields(train) if f.name in names})


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
      guess = did_you_mean(section, sections, suffix=f".{field}") if field else did_you_mean(key, ["name"])
      raise ConfigError(f"{key}: unknown key{guess}; use model.*, data.*, train.* or name")
  model, data = config.model, config.data
  family = sections["model"].pop("family", None)
  if family is not None:
    model = switch_family(model, family)
  kind = sections["data"].pop("kind", None)
  if kind is not None:
    data = switch_kind(data, kind)
  model = replace_fields(model, sections["model"], "model")
  data = replace_fields(data, sections["data"], "data")
  train = train_for(type(model), config.train)  # the train.* fields the family has
  train = replace_fields(train, _fit_warmup(train, sections["train"]), "train")
  return dataclasses.replace(config, model=model, data=data, train=train, **top)


def _fit_warmup(train, values):
  """``train.steps=N`` below the experiment's warm-up, with no ``train.warmup_steps`` given (a
  smoke test of a long recipe): the warm-up keeps its share of the run, with a one-line notice
  on stderr, rather than fail validation. An explicit warm-up longer than the run still fails."""
  if "steps" not in values or "warmup_steps" in values:
    return values
  steps = values["steps"]
  if isinstance(steps, str):
    steps = parse_value(steps, field_types(type(train))["steps"], "train.steps")
  if not 1 <= steps < train.warmup_steps:
    return values
  warmup = min(steps, round(train.warmup_steps * steps / train.steps))
  print(f"note: train.steps={steps} is shorter than the warm-up of {train.warmup_steps} steps: "
        f"train.warmup_steps={warmup} (set it to choose another)", file=sys.stderr)
  return {**values, "warmup_steps": warmup}


# ----------------------------------------------------------------------------- files and JSON


def config_names(search_dir="configs"):
  """{name: the first paragraph of its docstring} of the experiment files in ``search_dir``."""
  names = {}
  for file in sorted(os.listdir(search_dir)) if os.path.isdir(search_dir) else []:
    if file.endswith(".py") and not file.startswith("_"):
      with open(os.path.join(search_dir, file)) as f:
        names[file[:-3]] = _first_docstring_line(f.read())
  return names


def _first_docstring_line(source):
  try:
    doc = ast.get_docstring(ast.parse(source)) or ""
  except SyntaxError:
    doc = ""
  first = " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph, on one line
  # as a terminal shows it: no reStructuredText literals, and a lead-in colon ends the sentence
  first = first.replace("``", "`")
  return first[:-1] + "." if first.endswith(":") else first


_EXPERIMENT_MODULES = {}  # (path, modified) -> module: an experiment file runs once per process and version


def experiment_module(path, on_path=True):
  """The experiment file at ``path``, run as a module. With ``on_path`` (a file the user names)
  its folder joins ``sys.path`` (at the end, so it shadows no installed package): a family module
  or backend kept beside the experiment file is imported by name, with no PYTHONPATH, and the
  run records it. The named experiments (configs/) import nothing of their folder."""
  path = os.path.abspath(path)
  key = (path, os.stat(path).st_mtime_ns)
  if key not in _EXPERIMENT_MODULES:
    folder = os.path.dirname(path)
    if on_path and folder not in sys.path:
      sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(f"lpcjax_experiment_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _EXPERIMENT_MODULES[key] = module
  return _EXPERIMENT_MODULES[key]


def _experiment_path(path_or_name, search_dir):
  """(the experiment file, the argument after its colon, whether the user gave the file itself
  rather than a name in ``search_dir``) of ``path_or_name``."""
  path_or_name, _, argument = path_or_name.partition(":")
  if os.path.exists(path_or_name):
    return path_or_name, argument, True
  candidate = os.path.join(search_dir, f"{path_or_name}.py")
  if not os.path.exists(candidate):
    names = config_names(search_dir)
    raise ConfigError(f"config {path_or_name!r}: no such file, nor {candidate}"
                      f"{did_you_mean(path_or_name, names, n=3)}; configs: {', '.join(names)} (--list-configs "
                      "describes them)")
  return candidate, argument, False


def experiment_hooks(path_or_name, config, search_dir="configs"):
  """The trainer hooks the experiment file registers: its ``get_hooks(config)`` (a list of
  ``lpcjax.training.Hook``), or none when it defines no such function."""
  path, _, given = _experiment_path(path_or_name, search_dir)
  get_hooks = getattr(experiment_module(path, on_path=given), "get_hooks", None)
  return tuple(get_hooks(config) or ()) if get_hooks else ()


def load_experiment(path_or_name, search_dir="configs"):
  """Load ``get_config()`` from a Python file, or from ``configs/<name>.py``.

  ``file:arg`` (as in ml_collections) calls ``get_config("arg")``: ``paper:fox_pro_760m``.
  """
  path, argument, given = _experiment_path(path_or_name, search_dir)
  module = experiment_module(path, on_path=given)
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
  """The config as plain data, with the modules that registered its family and data kind
  (``defined_in``), and of its attention backend where the model has one, so that a fresh process
  can import a family or a backend defined outside the package."""
  out = dataclasses.asdict(config)
  out["model"] = {"family": config.model.family, **out["model"]}
  out["data"] = {"kind": config.data.kind, **out["data"]}
  out["defined_in"] = {"model.family": models.source_of(config.model.family),
                       "data.kind": data.source_of(config.data.kind)}
  backend = kernels.source_of(getattr(config.model, "attention_impl", None))
  if backend is not None and not backend["module"].startswith("lpcjax."):  # one's own: imported before the check
    out["defined_in"]["model.attention_impl"] = backend
  return out


# Before data kinds had their own classes (lpcjax <= 0.1 run directories), every data section
# held every kind's fields. Loading such a config.json drops the other kinds' fields when they
# hold these old defaults; any other value is an error, since it would be silently ignored.
_FLAT_DATA_DEFAULTS = {"mqar_vocab_size": 8192, "mqar_num_pairs": 16, "mqar_gap_power": 0.1,
                       "train_files": [], "eval_files": [], "tokenizer_file": None, "train_tokens": None,
                       "eval_tokens": None, "segment_ids": False, "window_stride": None}


# Before a family's optimizer settings moved into its own train class (issue #33), every train
# section held PMT's and LPC-SM's: a family without them drops these old defaults on load.
_SHARED_TRAIN_DEFAULTS = {"lr_scales": [], "gate_patterns": [], "gate_adam_b2": 0.95, "gate_grad_clip": 100.0}


def _drop_old_defaults(values, cls, old_defaults):
  """``values`` without the keys ``cls`` lacks that hold their ``old_defaults``."""
  known = field_types(cls)
  return {k: v for k, v in values.items() if k in known or old_defaults.get(k, object()) != v}


def from_dict(values):
  """Rebuild an ExperimentConfig from ``to_dict`` output (e.g. a run's config.json). The
  family, data kind and attention backend are looked up by name, after importing the modules
  the config records when they are not registered yet; the family upgrades what older versions saved."""
  sources = values.get("defined_in", {})
  family = models.get(values["model"]["family"], sources.get("model.family"))
  impl = values["model"].get("attention_impl")
  if sources.get("model.attention_impl") and impl not in kernels.available_impls():
    import_source(sources["model.attention_impl"])
  values = family.upgrade_saved({**values, "model": dict(values["model"]), "data": dict(values["data"])})
  model_values, data_values = dict(values["model"]), dict(values["data"])
  del model_values["family"]
  kind = data.get(data_values.pop("kind", "mqar"), sources.get("data.kind"))
  data_values = _drop_old_defaults(data_values, kind.config_cls, _FLAT_DATA_DEFAULTS)
  train_values = _drop_old_defaults(values["train"], family.train_config_cls, _SHARED_TRAIN_DEFAULTS)

  def build(cls, raw, prefix):
    known = field_types(cls)
    unknown = set(raw) - set(known)
    if unknown:
      raise ConfigError(f"{prefix}.{sorted(unknown)[0]}: unknown key in saved config")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})

  return ExperimentConfig(model=build(family.config_cls, model_values, "model"),
                          data=build(kind.config_cls, data_values, "data"),
                          train=build(family.train_config_cls, train_values, "train"),
                          name=values.get("name", "experiment"))


def to_json(config):
  return json.dumps(to_dict(config), indent=2, sort_keys=True)
