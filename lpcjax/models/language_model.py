"""What the language-model families share: token inputs, next-token loss, the attention
backend's check and the per-token evaluator (the data kinds and the vocabulary check are the
config's: ``lpcjax.models.decoder_config``). ``language_model_family(name, config_cls,
module_cls, **fields)`` is a ``Family`` with these defaults; any field can be given to replace
one."""

import jax
import jax.numpy as jnp
import numpy as np

from lpcjax.config import require
from lpcjax.evaluation.language_model import LanguageModelEvaluator
from lpcjax.kernels import unsupported
from lpcjax.losses import lm_loss

from .decoder_config import DecoderConfig
from .family import Family


def token_inputs(data_config):
  """Example model inputs for abstract init: int32 tokens [1, seq_len]."""
  return (jnp.zeros((1, data_config.seq_len), jnp.int32),)


def check_attention_impl(model, context_parallel=False):
  """``model.attention_impl`` against the kernel backends' declared support (head dim, compute
  dtype, window; with ``context_parallel``, the ring's pair kernels): a one-line ConfigError
  when a run starts, not a traceback when the model is traced. Not the platform: a config may
  be written on one machine for another. A model config that lacks one of the decoder's fields
  (a language model of one's own) is checked on those it has. It needs the backends' table
  (JAX), so it is the family's check, not the config's."""
  heads = getattr(model, "num_heads", None)
  kv_heads = getattr(model, "resolved_kv_heads", heads)
  problem = unsupported(model.attention_impl, head_dim=getattr(model, "resolved_head_dim", None),
                        dtype=getattr(model, "dtype", None), window=getattr(model, "attention_window", None),
                        context_parallel=context_parallel, kv_group=heads // kv_heads if heads else None)
  require(problem is None, "model.attention_impl", problem)


def check_language_model(config):
  """Where the model has an attention backend: whether it supports the model, and whether it
  can run with the sequence split over the mesh (``train.mesh_context``)."""
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
  defaults = dict(loss=lm_loss, example_inputs=token_inputs, check=check_language_model,
                  evaluator=language_model_evaluator(), throughput_unit="tokens",
                  units_per_example=lambda config: config.data.seq_len)
  # sith counts the m predicted tokens of a longer window: its units are not the decoder's
  if issubclass(config_cls, DecoderConfig) and "units_per_example" not in fields:
    defaults["flops_per_unit"] = decoder_flops_per_token
  return Family(name, config_cls, module_cls, **{**defaults, **fields})
