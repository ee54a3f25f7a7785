"""The evaluators of the families and their probes. Each family names its evaluator
(``Family.evaluator``, an ``Evaluator``): the language models' one gives per-token loss curves,
perplexity vs context and retrieval probes; the time-series encoders' one (``series``) linear
and cue-retention probes on frozen features.

These sit below the families. Loading a run directory and running its family's evaluator
(``load_run``, ``evaluate_run``) is in ``lpcjax.runs``, above the families and the trainer.
"""

from .language_model import LanguageModelEvaluator
from .needle import needle_example, needle_grid, score_answers, score_generated
from .per_token import context_lengths, per_token_losses, sequence_logits, summarize
from .protocol import Evaluator
from .recall import answer_accuracy, recall_by_distance
from .series import SeriesEvaluator

__all__ = ["Evaluator", "LanguageModelEvaluator", "SeriesEvaluator", "context_lengths", "needle_example",
           "needle_grid", "per_token_losses", "recall_by_distance", "answer_accuracy", "score_answers",
           "score_generated",
           "sequence_logits", "summarize"]
