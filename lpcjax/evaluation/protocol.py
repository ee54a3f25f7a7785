"""What eval.py runs for a family: the ``Evaluator`` protocol.

A family names its evaluator's factory (``Family.evaluator``); eval.py never branches on the
family. ``LanguageModelEvaluator`` (the language models) and ``SeriesEvaluator`` (time-series
encoders) are the two in the package; ``tests/toy_family.py`` has a third.
"""

import argparse
from typing import Protocol


class Evaluator(Protocol):
  def add_arguments(self, parser: argparse.ArgumentParser) -> None:
    """Its command-line options (eval.py adds them after --run/--compare/--out)."""

  def evaluate(self, run, options: argparse.Namespace) -> dict:
    """A JSON-ready result for one ``LoadedRun`` (``lpcjax.runs``)."""

  def write(self, results: list, out_dir: str, options: argparse.Namespace) -> None:
    """The result file(s) and plots of one or more runs, into ``out_dir``."""

  def report(self, result: dict) -> list:
    """Lines for the terminal."""

  # Optional: ``out_name(options) -> str``, the default output folder under the first run
  # (eval.py uses "eval" when an evaluator has none).
