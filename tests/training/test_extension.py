"""Extending lpcjax from outside the package, exactly as docs/adding_a_family.md says: a folder
that is not the checkout holds an experiment file, the family module beside it and an attention
backend of one's own; train.py and eval.py run in fresh processes there, with no PYTHONPATH.

The family (``tiny_lm``) is a language model that is not a decoder: one attention layer between
an embedding and a head, its config a ``LanguageModelConfig`` (no ``num_layers``), so the trainer
has no FLOPs estimate for it and says so once. Its attention runs a backend registered in
``tiny_backend.py`` (the blockwise XLA kernel under another name), which the run records so that
a fresh eval.py imports it before checking ``model.attention_impl``."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

FAMILY = '''
import dataclasses
from typing import ClassVar

import flax.linen as nn

from lpcjax import models
from lpcjax.layers import AttentionConfig, ForgettingAttention, GateConfig


@dataclasses.dataclass(frozen=True)
class TinyLMConfig(models.LanguageModelConfig):
  family: ClassVar[str] = "tiny_lm"

  vocab_size: int = 64
  d_model: int = 32
  num_heads: int = 2
  head_dim: int = 16
  attention_impl: str = "auto"


class TinyLM(nn.Module):
  config: TinyLMConfig

  @nn.compact
  def __call__(self, tokens, segment_ids=None):
    cfg = self.config
    x = nn.Embed(cfg.vocab_size, cfg.d_model)(tokens)
    attention = AttentionConfig(d_model=cfg.d_model, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                                use_rope=False, gate=GateConfig(num_heads=cfg.num_heads), impl=cfg.attention_impl)
    x = x + ForgettingAttention(attention)(nn.RMSNorm()(x), segment_ids)
    return nn.Dense(cfg.vocab_size)(nn.RMSNorm()(x))


models.register(models.language_model_family("tiny_lm", TinyLMConfig, TinyLM))
'''

BACKEND = '''
import dataclasses

from lpcjax import kernels

# The blockwise XLA kernel under another name: a user's build of a kernel, registered by this file.
kernels.register_backend(dataclasses.replace(kernels.resolve("xla"), name="tiny_xla", priority=None))
'''

EXPERIMENT = '''
import tiny_backend  # noqa: F401  (registers impl="tiny_xla")
from tiny_lm import TinyLMConfig

from lpcjax.data import MQARDataConfig
from lpcjax.experiment import ExperimentConfig, TrainConfig


def get_config():
  return ExperimentConfig(
      model=TinyLMConfig(attention_impl="tiny_xla"),
      data=MQARDataConfig(seq_len=32, batch_size=8, mqar_vocab_size=64, mqar_num_pairs=2),
      train=TrainConfig(steps=3, warmup_steps=1, log_every=1, eval_every=0, eval_batches=1, run_dir={runs!r}),
      name="tiny_lm")
'''

NAMELESS = '''
import dataclasses

from tiny_lm import TinyLM, TinyLMConfig

from lpcjax import models
from lpcjax.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Unnamed(ModelConfig):  # the class attribute `family` is missing
  vocab_size: int = 64


models.register(models.language_model_family("unnamed", Unnamed, TinyLM))


def get_config():
  raise AssertionError("not reached: registering the family fails first")
'''


@pytest.fixture
def outside(tmp_path):
  """A folder outside the checkout holding the family, the backend and the experiment files."""
  folder = tmp_path / "my_project"
  folder.mkdir()
  (folder / "tiny_lm.py").write_text(textwrap.dedent(FAMILY))
  (folder / "tiny_backend.py").write_text(textwrap.dedent(BACKEND))
  (folder / "experiment.py").write_text(textwrap.dedent(EXPERIMENT).format(runs=str(tmp_path / "runs")))
  (folder / "nameless.py").write_text(textwrap.dedent(NAMELESS))
  return folder


def run_in(folder, *args):
  """A fresh Python process in ``folder``, which is not on any import path it is given."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  return subprocess.run([sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_a_family_and_backend_beside_the_experiment_train_and_evaluate_in_fresh_processes(outside, tmp_path):
  trained = run_in(outside, str(REPO / "train.py"), "--config", "experiment.py", "train.run_name=tiny")
  assert trained.returncode == 0, trained.stderr
  # no FLOPs for a model that is not a decoder: said once, in the start block, not per log row
  assert trained.stdout.count("mfu      not logged: the tiny_lm family gives no FLOPs estimate "
                              "(Family.flops_per_unit)") == 1
  run_dir = tmp_path / "runs" / "tiny"
  rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3] and not any("mfu" in r for r in rows)
  recorded = json.load(open(run_dir / "config.json"))["defined_in"]
  assert recorded["model.family"] == {"module": "tiny_lm", "file": str(outside / "tiny_lm.py")}
  assert recorded["model.attention_impl"] == {"module": "tiny_backend", "file": str(outside / "tiny_backend.py")}

  # eval.py elsewhere: neither module is importable by name there; the run's records find both
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  evaluated = run_in(elsewhere, str(REPO / "eval.py"), "--run", str(run_dir), "--max-sequences", "8",
                     "--out", str(elsewhere / "eval"))
  assert evaluated.returncode == 0, evaluated.stderr
  result = json.load(open(elsewhere / "eval" / "per_token.json"))
  assert result["family"] == "tiny_lm" and result["num_sequences"] == 8 and result["mean_loss"] > 0


def test_a_family_config_without_a_family_name_is_one_line(outside):
  failed = run_in(outside, str(REPO / "train.py"), "--config", "nameless.py")
  assert failed.returncode == 2
  assert failed.stderr.strip().splitlines() == [
      "error: family 'unnamed': Unnamed names no family; a family config subclasses lpcjax.config.ModelConfig "
      'and names its family in a class attribute: family: ClassVar[str] = "NAME"']
