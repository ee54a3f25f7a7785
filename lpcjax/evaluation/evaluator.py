"""What eval.py runs for a family: its evaluator, found through the family of the run.

An evaluator is any object with
* ``add_arguments(parser)``: its command-line options (argparse);
* ``evaluate(run, options) -> dict``: a JSON-ready result for one ``LoadedRun``;
* ``write(results, out_dir, options)``: the result file(s) and plots of one or more runs;
  ``options`` is the argparse namespace of its arguments;
* ``report(result) -> [str]``: lines for the terminal.
A family names its evaluator's factory (``Family.evaluator``); eval.py never branches on the
family. ``lpcjax.evaluation.language_model.LanguageModelEvaluator`` is the language models' one.
"""

import argparse

from lpcjax import models
from lpcjax.training.runs import RunError, read_config

from .runs import load_run


def evaluators_of(run_dirs):
  """Each run's evaluator (its family's); compared runs need evaluators of one kind (class),
  whose options and plots they share (sith and fox runs: both language-model evaluators)."""
  families = [models.get(read_config(run_dir).model.family) for run_dir in run_dirs]
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
  (evaluator,) = evaluators_of([run_dir])
  return evaluator.evaluate(load_run(run_dir), evaluator_options(evaluator, **overrides))
