"""What the language-model families share: token inputs, next-token loss, the vocabulary check
and the per-token evaluator. ``language_model_family(name, config_cls, module_cls, **fields)``
is a ``Family`` with these defaults; any field can be given to replace one."""

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.config import require
from lpcjax.data import TASK_KINDS
from lpcjax.evaluation.language_model import LanguageModelEvaluator
from lpcjax.losses import lm_loss

from .decoder_config import DecoderConfig, check_attention_impl
from .family import Family

LM_DATA_KINDS = (*TASK_KINDS, "text", "tokens")


def token_inputs(data_config):
  """Example model inputs for abstract init: int32 tokens [1, seq_len]."""
  return (jnp.zeros((1, data_config.seq_len), jnp.int32),)


def check_vocab(config):
  """A language model's vocabulary holds every token of its data."""
  data_vocab = config.data.vocab_size
  require(config.model.vocab_size >= data_vocab, "model.vocab_size",
          f"{config.model.vocab_size} is smaller than the {config.data.kind} data's {data_vocab} tokens")


def check_language_model(config):
  """The vocabulary check, and where the model has an attention backend, whether it can run
  with the sequence split over the mesh (``train.mesh_context``), which only the experiment
  knows."""
  check_vocab(config)
  if hasattr(config.model, "attention_impl"):
    check_attention_impl(config.model, context_parallel=config.train.mesh_context != 1)


def language_model_evaluator(sequence_logits=None):
  """The evaluator factory of a language-model family; ``sequence_logits`` replaces the plain
  forward pass for models that read fixed windows (see LanguageModelEvaluator)."""
  if sequence_logits is None:
    return LanguageModelEvaluator
  return lambda: LanguageModelEvaluator(sequence_logits=sequence_logits)


def decoder_flops_per_token(config, params):
  """Training FLOPs per token of a decoder, the usual estimate (as in PaLM's MFU): 6 x the
  non-embedding parameters (forward and backward of every matmul) plus causal attention's
  12 x layers x heads x head_dim x the mean number of keys a query sees over data.seq_len
  (within model.attention_window where there is one). Not counted: what is no matmul (forget
  gates, norms) and a family's own recurrences (LPC-SM's memory)."""
  embedding = sum(int(np.prod(leaf.shape)) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                  if any(getattr(key, "key", None) == "embed" for key in path))
  dense = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params)) - embedding
  model, length = config.model, config.data.seq_len
  window = min(getattr(model, "attention_window", None) or length, length)
  mean_keys = (window * (window + 1) / 2 + (length - window) * window) / length
  return 6 * dense + 12 * model.num_layers * model.num_heads * model.resolved_head_dim * mean_keys


def language_model_family(name, config_cls, module_cls, **fields):
  """A Family that reads tokens and predicts the next one; throughput counts tokens (every
  position of data.seq_len). A decoder (its config a ``DecoderConfig``) that counts tokens so
  gets the FLOPs per token of ``decoder_flops_per_token``; any other model gives its own
  ``flops_per_unit``, or none, and then MFU is not logged."""
  defaults = dict(loss=lm_loss, example_inputs=token_inputs, data_kinds=LM_DATA_KINDS, check=check_language_model,
                  evaluator=language_model_evaluator(), throughput_unit="tokens",
                  units_per_example=lambda config: config.data.seq_len)
  # sith counts the m predicted tokens of a longer window: its units are not the decoder's
  if issubclass(config_cls, DecoderConfig) and "units_per_example" not in fields:
    defaults["flops_per_unit"] = decoder_flops_per_token
  return Family(name, config_cls, module_cls, **{**defaults, **fields})
