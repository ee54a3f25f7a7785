"""Evaluation of trained runs: per-token loss curves, perplexity vs context, retrieval probes."""

from .evaluate import evaluate_run, write_outputs
from .needle import needle_example, needle_grid, score_answers
from .per_token import context_lengths, per_token_losses, summarize
from .recall import recall_by_distance
from .runs import RunError, load_run

__all__ = ["RunError", "context_lengths", "evaluate_run", "load_run", "needle_example", "needle_grid",
           "per_token_losses", "recall_by_distance", "score_answers", "summarize", "write_outputs"]
