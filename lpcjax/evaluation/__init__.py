"""Evaluation of trained runs. Each family names an evaluator (``lpcjax.evaluation.evaluator``);
the language models' one gives per-token loss curves, perplexity vs context and retrieval probes;
the time-series encoders' one (``series``) linear and cue-retention probes on frozen features."""

from .evaluator import evaluate_run, evaluator_options, evaluators_of
from .language_model import LanguageModelEvaluator
from .needle import needle_example, needle_grid, score_answers, score_generated
from .per_token import context_lengths, per_token_losses, sequence_logits, summarize
from .recall import recall_by_distance
from .runs import LoadedRun, RunError, load_run
from .series import SeriesEvaluator

__all__ = ["LanguageModelEvaluator", "LoadedRun", "RunError", "SeriesEvaluator", "context_lengths", "evaluate_run", "evaluator_options", "evaluators_of",
           "load_run", "needle_example", "needle_grid", "per_token_losses", "recall_by_distance",
           "score_answers", "score_generated", "sequence_logits", "summarize"]
