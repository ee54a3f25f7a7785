"""Trained runs, loaded and evaluated: what eval.py, ``python -m lpcjax.generate`` and the
conversion read.

This floor sits above the families (``lpcjax.models``, which name their evaluators) and the
run directory (``lpcjax.training.run_directory``, which restores a checkpoint); the evaluators
themselves (``lpcjax.evaluation``) sit below the families and are handed a ``LoadedRun``, so
models, training and evaluation import one way (docs/layout.md). Loading restores parameters
and mutable collections only, never the optimizer state.
"""

import argparse
import dataclasses

import flax.linen as nn
import jax

from lpcjax import models
from lpcjax.data import with_tokenizer
from lpcjax.sharding import make_mesh, rules_from_config
from lpcjax.training.run_directory import RunError, read_config, restore_variables

__all__ = ["LoadedRun", "RunError", "evaluate_run", "evaluator_options", "evaluators_of", "load_run", "read_config"]


@dataclasses.dataclass(frozen=True)
class LoadedRun:
  """What an evaluator gets: the run's config, family and model, its restored params and
  mutable collections (sharded on ``mesh`` by ``rules``)."""

  run_dir: str
  config: object
  family: object
  model: object
  params: object
  mutable: dict
  mesh: object
  rules: tuple
  step: int

  @property
  def variables(self):
    """The dict ``model.apply`` takes: params and the mutable collections."""
    return {"params": self.params, **self.mutable}


def load_run(run_dir, mesh=None, step=None, tokenizer_file=None, config=None):
  """A LoadedRun of ``run_dir``'s checkpoint ``step`` (default: the latest), restored onto
  ``mesh`` (default: every local device on the data axis) under the run's logical rules; its
  params and mutable collections only, not the optimizer state. ``tokenizer_file`` replaces the
  run's recorded rank file (``lpcjax.data.with_tokenizer``); ``config``: the run's, when the
  caller has read it already (config.json is read once per command)."""
  config = read_config(run_dir) if config is None else config
  if mesh is None:
    mesh = make_mesh(dataclasses.replace(config.train, mesh_data=-1, mesh_fsdp=1,
                                         mesh_context=1, mesh_tensor=1))
  rules = rules_from_config(config.train)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):  # parameters only: no optimizer state
    config, family, model, params, mutable, step = restore_variables(run_dir, mesh, rules, step, config)
  config = dataclasses.replace(config, data=with_tokenizer(config.data, tokenizer_file, saved=True))
  return LoadedRun(run_dir, config, family, model, params, mutable, mesh, rules, step)


def evaluators_of(configs):
  """Each run's evaluator (its family's), from the runs' configs (``read_config``); compared
  runs need evaluators of one kind (class), whose options and plots they share (sith and fox
  runs: both language-model evaluators)."""
  families = [models.get(config.model.family) for config in configs]
  evaluators = [family.evaluator() for family in families]
  if len({type(evaluator) for evaluator in evaluators}) > 1:
    raise RunError(f"cannot compare runs evaluated differently: families {sorted({f.name for f in families})}")
  return evaluators


def evaluator_options(evaluator, **overrides):
  """The evaluator's options as eval.py would parse them with no flags, with ``overrides`` (by
  argparse dest, e.g. ``eval_len=1024``) set; an unknown name is a TypeError."""
  parser = argparse.ArgumentParser()
  evaluator.add_arguments(parser)
  options = parser.parse_args([])
  unknown = sorted(set(overrides) - set(vars(options)))
  if unknown:
    raise TypeError(f"unknown evaluator option {unknown[0]!r}; known: {', '.join(sorted(vars(options)))}")
  vars(options).update(overrides)
  return options


def evaluate_run(run_dir, **overrides):
  """Load ``run_dir`` and run its family's evaluator (options as in ``evaluator_options``)."""
  config = read_config(run_dir)
  (evaluator,) = evaluators_of([config])
  return evaluator.evaluate(load_run(run_dir, config=config), evaluator_options(evaluator, **overrides))
