"""Data sources. ``make_batches(data_config, seed, split)`` returns an object whose
``batch(step)`` gives {inputs, targets, loss_mask} numpy arrays, deterministic in (seed, step)."""

from .errors import DataError
from .mqar import MQARBatches, mqar_example
from .text import TextBatches, tokenize_files
from .tokenizer import TokenizerError, load_gpt2_tokenizer


def make_batches(data_config, seed, split="train"):
  if data_config.kind == "mqar":
    return MQARBatches(data_config, seed, split)
  return TextBatches(data_config, seed, split)


__all__ = ["DataError", "MQARBatches", "TextBatches", "TokenizerError", "load_gpt2_tokenizer", "make_batches",
           "mqar_example", "tokenize_files"]
