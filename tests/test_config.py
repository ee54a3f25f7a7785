import json
import re

import pytest

from lpcjax import experiment as C
from lpcjax import models
from lpcjax.models import FoXConfig, TransformerConfig

from conftest import REPO, cli


def base():
  return C.load_experiment(str(REPO / "configs" / "fox_tiny_mqar.py"))


def test_overrides_parse_by_field_type():
  cfg = C.apply_overrides(base(), ["model.d_model=96", "model.use_rope=true", "train.learning_rate=1e-3",
                                   "model.head_dim=none", "data.kind=text", "model.vocab_size=50257",
                                   "data.train_files=a.txt,b.txt", "name=x"])
  assert cfg.model.d_model == 96 and cfg.model.use_rope is True
  assert cfg.train.learning_rate == 1e-3 and cfg.model.head_dim is None
  assert cfg.data.train_files == ("a.txt", "b.txt") and cfg.name == "x"


@pytest.mark.parametrize("override,field", [
    ("model.d_modle=3", "model.d_modle: unknown key"),
    ("optim.lr=3", "optim.lr: unknown key"),
    ("model.d_model=wide", "model.d_model: expected int"),
    ("model.use_rope=maybe", "model.use_rope: expected a boolean"),
    ("model.use_rope=yes", r"model.use_rope: expected a boolean \(true or false\), got 'yes'"),  # was taken as true
    ("modle.d_model=3", r"modle.d_model: unknown key \(did you mean model.d_model\?\)"),
    ("model.num_heads=5", "model.num_heads: d_model=64 is not divisible"),
    ("model.block=moe", "model.block: must be one of"),
    ("model.forget_gate=sometimes", "model.forget_gate: must be one of"),
    ("model.vocab_size=100", "model.vocab_size: 100 is smaller than the mqar data's 256 tokens"),
    ("data.mqar_num_pairs=100", "data.mqar_num_pairs:"),
    ("train.warmup_steps=999999", "train.warmup_steps:"),
    ("model.attention_impl=cuda", "model.attention_impl: unknown backend 'cuda'; known: auto, "),
    ("model.attention_impl=trion", r"model.attention_impl: unknown backend 'trion' \(did you mean triton\?\)"),
    ("model.family=mamba", "model.family: unknown model family 'mamba'"),
    ("data.kind=ucr", "data.kind: unknown kind 'ucr'"),
    ("data.train_files=a.txt", "data.train_files: unknown key for data.kind='mqar'"),
    ("train.mesh_contxt=4", r"train.mesh_contxt: unknown key for train \(did you mean train.mesh_context\?\); "
                            r"known keys are \[.*'mesh_context'"),
    ("model.family=foxx", r"model.family: unknown model family 'foxx' \(did you mean fox\?\)"),
    ("just_a_word", "expected section.field=value"),
])
def test_bad_overrides_name_the_field(override, field):
  with pytest.raises(C.ConfigError, match=field):
    C.apply_overrides(base(), [override])


def test_a_mistyped_config_name_lists_the_configs(capsys):
  configs = sorted(path.stem for path in (REPO / "configs").glob("*.py") if not path.name.startswith("_"))
  with pytest.raises(C.ConfigError, match=r"config 'fox_tiny': no such file, nor .* \(did you mean fox_tiny_text or "
                                          rf"fox_tiny_mqar\?\); configs: {', '.join(configs)} \(--list-configs"):
    C.load_experiment("fox_tiny", str(REPO / "configs"))
  assert cli("train")(["--list-configs"]) == 0
  listed = capsys.readouterr().out.splitlines()
  assert [line.split()[0] for line in listed] == configs
  assert "paper:<family>[_pro]_<size>" in listed[configs.index("paper")]  # each with its docstring's summary


def test_switching_family_keeps_shared_fields():
  cfg = C.apply_overrides(base(), ["model.family=transformer", "model.use_rope=false"])
  assert isinstance(cfg.model, TransformerConfig) and not isinstance(cfg.model, FoXConfig)
  assert cfg.model.d_model == base().model.d_model and cfg.model.use_rope is False
  assert cfg.model.forget_gate == "none"


def test_json_round_trip():
  cfg = C.apply_overrides(base(), ["data.kind=text", "model.vocab_size=50257", "data.train_files=a,b"])
  again = C.from_dict(json.loads(C.to_json(cfg)))
  assert again == cfg


def test_paper_configs_load(repo_root):
  for spec in ("fox_125m", "fox_pro_360m", "transformer_760m", "transformer_pro_125m"):
    cfg = C.load_experiment(f"paper:{spec}", str(repo_root / "configs"))
    assert cfg.data.seq_len == 16384 and cfg.model.vocab_size == 50257
  cfg = C.load_experiment("paper:transformer_760m", str(repo_root / "configs"))
  assert cfg.model.resolved_head_dim == 128 and cfg.model.rope_theta == 500000.0
  # The official budgets are binary: 15 Gi tokens, warm-up 256 Mi, over 32 x 16384 tokens a step.
  assert cfg.train.steps == 15 * 2**30 // (32 * 16384) == 30720 and cfg.train.warmup_steps == 512
  for spec, tokens in (("transformer_125m", 2_684_354_560), ("transformer_pro_360m", 7_516_192_768),
                       ("fox_760m", 16_106_127_360)):
    cfg = C.load_experiment(f"paper:{spec}", str(repo_root / "configs"))
    assert cfg.train.steps * 32 * 16384 == tokens and cfg.train.warmup_steps * 32 * 16384 == 268_435_456
    assert cfg.model.rope_theta == 500000.0  # every size, as the official baselines
  with pytest.raises(C.ConfigError, match="unknown"):
    C.load_experiment("paper:fox_9b", str(repo_root / "configs"))


def test_every_experiment_file_loads(repo_root):
  for path in sorted((repo_root / "configs").glob("*.py")):
    if not path.name.startswith("_"):  # __init__.py: configs/ is installed as the package lpcjax.configs
      assert isinstance(C.load_experiment(str(path)), C.ExperimentConfig)


def test_missing_config_file():
  with pytest.raises(C.ConfigError, match="no such file"):
    C.load_experiment("does_not_exist")


def test_the_shared_modules_know_no_family():
  """TrainConfig holds nothing of one family, and no shared module names a family: each family's
  optimizer settings and config upgrades are in its own module (Family.train_config_cls,
  Family.upgrade_saved)."""
  import dataclasses

  from lpcjax import models
  from lpcjax.config import TrainConfig
  family_fields = {"lr_scales", "gate_patterns", "gate_adam_b2", "gate_grad_clip"}
  assert not family_fields & {f.name for f in dataclasses.fields(TrainConfig)}
  shared = [REPO / "lpcjax" / name for name in ("config.py", "experiment.py", "registry.py")]
  shared += sorted((REPO / "lpcjax" / "training").glob("*.py"))
  for path in shared:
    text = path.read_text()
    for name in models.names():
      assert f'"{name}"' not in text and f"'{name}'" not in text, f"{path.name} names the {name} family"


def test_a_family_owns_its_train_settings():
  from lpcjax.models.pmt import PMTTrainConfig
  pmt = C.load_experiment("pmt:tiny", str(REPO / "configs"))
  assert isinstance(pmt.train, PMTTrainConfig) and pmt.train.gate_patterns
  assert C.apply_overrides(pmt, ["train.gate_adam_b2=0.9"]).train.gate_adam_b2 == 0.9
  assert C.from_dict(json.loads(C.to_json(pmt))) == pmt
  with pytest.raises(C.ConfigError, match="train.gate_patterns: unknown key for train"):
    C.apply_overrides(base(), ["train.gate_patterns=x"])
  # A plain TrainConfig (an experiment file's) becomes the family's class; another family's
  # setting is an error, not silently dropped.
  assert isinstance(C.ExperimentConfig(model=pmt.model, data=pmt.data, train=C.TrainConfig()).train, PMTTrainConfig)
  with pytest.raises(C.ConfigError, match="train.gate_patterns: the fox family's optimizer has no such setting"):
    C.ExperimentConfig(model=base().model, data=base().data, train=pmt.train)


def test_old_config_json_still_loads():
  """A config.json written before the families' train settings left TrainConfig (their old
  defaults in every train section) and before runs recorded their family's module."""
  values = json.loads(C.to_json(base()))
  del values["defined_in"]
  values["train"].update(lr_scales=[], gate_patterns=[], gate_adam_b2=0.95, gate_grad_clip=100.0)
  assert C.from_dict(values) == base()
  values["train"]["gate_patterns"] = ["gate"]
  with pytest.raises(C.ConfigError, match="train.gate_patterns: unknown key in saved config"):
    C.from_dict(values)


def test_a_run_records_where_its_family_is_defined():
  values = C.to_dict(base())
  assert values["defined_in"]["model.family"]["module"] == "lpcjax.models.fox"
  assert values["defined_in"]["data.kind"]["module"] == "lpcjax.data.mqar"


@pytest.mark.parametrize("overrides,message", [
    (["model.attention_impl=pallas", "model.head_dim=8"],
     "model.attention_impl: impl='pallas' supports head_dim in (16, 32, 64, 128), got 8"),
    (["model.attention_impl=pallas_tpu", "train.mesh_context=2"],
     "model.attention_impl: impl='pallas_tpu' has no context-parallel path; backends with one: pallas, triton, xla"),
    (["model.attention_impl=triton", "model.dtype=bfloat16", "model.head_dim=12"], "impl='triton' supports head_dim"),
])
def test_the_backend_table_checks_the_config(overrides, message):
  """What a backend cannot run is a one-line error when a run starts (``models.checked_family``,
  kernels/backends.py): the backends' table needs JAX, which the config's own checks do not load."""
  config = C.apply_overrides(base(), overrides)
  with pytest.raises(C.ConfigError, match=re.escape(message)):
    models.checked_family(config)
  for impl in ("xla", "pallas", "triton"):  # the ring runs the GPU kernels' pair kernels too
    overrides = [f"model.attention_impl={impl}", "train.mesh_context=2", "model.head_dim=16"]
    assert models.checked_family(C.apply_overrides(base(), overrides)).name == "fox"


def test_the_backend_names_known_before_jax_are_the_tables():
  """The names a config accepts before JAX loads (kernels/names.py) are the backends lpcjax's own
  modules register in the table, no more and no fewer."""
  from lpcjax.kernels import available_impls, source_of
  from lpcjax.kernels.names import BUILT_IN
  own = {"auto"} | {name for name in available_impls() if name != "auto"
                    and source_of(name)["module"].startswith("lpcjax.kernels.")}
  assert own == set(BUILT_IN)
