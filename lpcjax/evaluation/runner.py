"""Evaluate run directories: run a trained run's family's evaluator.

This module sits above the families and the run directory (``lpcjax.training.run_directory``,
which loads a run: ``load_run``, re-exported here); the evaluators themselves
(``lpcjax.evaluation``) sit below the families that name them, and are handed a ``LoadedRun``.
"""

import argparse

from lpcjax import models
from lpcjax.training.run_directory import LoadedRun, RunError, load_run, read_config

__all__ = ["LoadedRun", "RunError", "evaluate_run", "evaluator_options", "evaluators_of", "load_run", "read_config"]


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
