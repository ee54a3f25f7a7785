"""Convert PyTorch FoX checkpoints (Hugging Face format) to lpcjax run directories, and back.

  python -m lpcjax.convert SRC OUT                      # HF directory -> lpcjax run directory
  python -m lpcjax.convert --to-hf RUN OUT              # lpcjax run -> HF directory (official format)
  python -m lpcjax.convert --to-hf RUN OUT --format fla # ... for flash-linear-attention's FoX

Import reads config.json and the weights (``*.safetensors``, or ``*.bin`` with torch
installed), picks the format from config.json (see ``lpcjax.convert.formats``) and writes an
ordinary run directory: ``config.json`` (the resolved ExperimentConfig) and an Orbax checkpoint
at step 0 written by the trainer's own Checkpointer, so ``eval.py --run OUT``,
``python -m lpcjax.generate --run OUT`` and ``train.init_from=OUT`` read it like any run. Its
optimizer state is AdamW's zero moments (the PyTorch checkpoints carry none; Orbax compresses
the zeros away) and it has no data-iterator state, so it cannot be ``--resume``d; fine-tune it
with ``train.init_from``. Choices:

* params are float32 whatever the checkpoint stored (bfloat16 widens exactly); the compute
  dtype is ``dtype`` (default float32);
* the data section: GPT-2 token files (``data.kind=tokens``) at ``seq_len`` tokens (default
  16384, the FoX paper's training length) when the vocabulary covers GPT-2's, otherwise an MQAR
  section sized to the vocabulary (a placeholder so that the config validates; evaluate with
  your own data options); ``tokenizer_file`` (``--tokenizer-file``) records the GPT-2 rank file
  in it, so that eval.py and generate find the tokenizer offline;
* ``source.json`` in the run directory records what was converted, ``source_config.json`` is
  the source's config.json as read: an export to the same model type writes back every key of it
  that lpcjax does not set itself (token ids, ``max_position_embeddings``, ``use_cache``, ...),
  rather than let the PyTorch package's defaults come back.

Export writes config.json and model.safetensors (float32) of lpcjax's latest (or ``step``)
checkpoint, loadable by the official package's ``AutoModelForCausalLM`` once its classes are
registered, or by flash-linear-attention's. Both directions write under a temporary name and
rename when complete; an existing OUT is replaced only with ``force``.
"""

import json
import os

import flax.linen as nn
import jax
import numpy as np

from lpcjax import experiment, models
from lpcjax.data import MQARDataConfig, TokenFileConfig, TokenizerError, load_gpt2_tokenizer
from lpcjax.runs import load_run
from lpcjax.files import write_json_atomic
from lpcjax.layers.common import dtype_of, num_params
from lpcjax.training.checkpoint import Checkpointer
from lpcjax.training.run_directory import read_config as read_run_config
from lpcjax.training.steps import TrainState, make_optimizer

from . import formats, weights
from .formats import FORMATS, detect
from .hf_files import ConvertError, read_config, read_weights, staged_directory, write_model

__all__ = ["ConvertError", "FORMATS", "detect", "export_run", "import_checkpoint", "load_hf", "save_hf"]

GPT2_VOCAB_SIZE = 50257
PAPER_CONTEXT = 16384
SOURCE_CONFIG = "source_config.json"  # the imported config.json, kept for the export


def load_hf(src, dtype="float32"):
  """(format, model config, params as nested numpy dicts) of a Hugging Face directory."""
  hf = read_config(src)
  fmt, model_type = detect(hf)
  model = formats.model_config(fmt, model_type, hf, dtype=dtype)
  params = weights.to_params(fmt, model, read_weights(src))
  _check_shapes(model, params)
  return fmt, model, params


def _abstract_params(model_config):
  family = models.get(model_config.family)
  module = family.build(model_config)
  tokens = jax.ShapeDtypeStruct((1, 8), np.int32)
  variables = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), tokens))
  return nn.meta.unbox(variables)["params"]


def _check_shapes(model_config, params):
  """Every param the lpcjax model has, at its shape, and nothing else."""
  abstract = _abstract_params(model_config)
  want = {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(abstract)}
  have = {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(params)}
  for path in sorted(set(want) | set(have)):
    if path not in have:
      raise ConvertError(f"the checkpoint gives no value for lpcjax's {path}")
    if path not in want:
      raise ConvertError(f"the checkpoint gives {path}, which the lpcjax model does not have")
    if tuple(want[path].shape) != tuple(have[path].shape):
      raise ConvertError(f"{path}: the checkpoint's tensor has shape {tuple(have[path].shape)}, the lpcjax model "
                         f"built from its config.json needs {tuple(want[path].shape)}")


def experiment_config(model_config, name, seq_len=PAPER_CONTEXT, tokenizer_file=None):
  """The ExperimentConfig written beside an imported model (see the module docstring)."""
  if tokenizer_file and model_config.vocab_size < GPT2_VOCAB_SIZE:
    raise ConvertError(f"--tokenizer-file: the model has {model_config.vocab_size} tokens, fewer "
                       f"than GPT-2's {GPT2_VOCAB_SIZE}; it has no GPT-2 tokenizer")
  if tokenizer_file:
    try:  # a wrong path fails now, not at the first evaluation
      load_gpt2_tokenizer(tokenizer_file)
    except TokenizerError as error:
      raise ConvertError(f"--tokenizer-file: {error}") from None
    tokenizer_file = os.path.abspath(tokenizer_file)
  if model_config.vocab_size >= GPT2_VOCAB_SIZE:
    data = TokenFileConfig(seq_len=seq_len, batch_size=1, tokenizer_file=tokenizer_file)
  else:
    vocab = model_config.vocab_size
    pairs = max(1, min(16, vocab // 2 - 1, seq_len // 4))
    data = MQARDataConfig(seq_len=seq_len, batch_size=1, mqar_vocab_size=vocab, mqar_num_pairs=pairs)
  return experiment.ExperimentConfig(model=model_config, data=data, name=name)


def _is_run(path):
  return os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(os.path.join(path, "checkpoints"))


def _is_hf(path):
  return os.path.isfile(os.path.join(path, "config.json")) and not os.path.isdir(os.path.join(path, "checkpoints"))


def write_run(out, config, params, source, force=False, source_config=None):
  """An lpcjax run directory at ``out`` holding ``params`` at step 0 (see the module docstring)."""
  module = models.get(config.model.family).build(config.model)
  params = jax.tree.map(lambda a: jax.numpy.asarray(a, dtype=dtype_of(config.model.param_dtype)), params)
  state = TrainState.create(apply_fn=module.apply, params=params, tx=make_optimizer(config.train))
  with staged_directory(out, force, _is_run) as staging:
    write_json_atomic(os.path.join(staging, "config.json"), experiment.to_dict(config))
    write_json_atomic(os.path.join(staging, "source.json"), source)
    if source_config is not None:
      write_json_atomic(os.path.join(staging, SOURCE_CONFIG), source_config)
    checkpointer = Checkpointer(staging)
    try:
      checkpointer.save(0, state, config=experiment.to_dict(config))  # as the trainer's steps carry it
    finally:
      checkpointer.close()


def import_checkpoint(src, out, seq_len=PAPER_CONTEXT, dtype="float32", force=False,
                      tokenizer_file=None):
  """Convert the Hugging Face directory ``src`` into the lpcjax run directory ``out``.
  Returns the ExperimentConfig written."""
  fmt, model, params = load_hf(src, dtype=dtype)
  config = experiment_config(model, name=os.path.basename(os.path.abspath(src)), seq_len=seq_len,
                             tokenizer_file=tokenizer_file)
  hf = read_config(src)
  source = {"source": os.path.abspath(src), "format": fmt, "model_type": hf.get("model_type"),
            "num_params": num_params(params)}
  write_run(out, config, params, source, force=force, source_config=hf)
  return config


def save_hf(out, fmt, model_config, params, force=False, source_config=None):
  """Write lpcjax ``params`` of ``model_config`` as a Hugging Face directory in format ``fmt``;
  the keys of ``source_config`` (an imported config.json) that lpcjax does not set come along
  when it is of the same model type (another package's keys would mean nothing there)."""
  hf = formats.hf_config(fmt, model_config)
  if source_config and source_config.get("model_type") == hf["model_type"]:
    hf = {**source_config, **hf}
  tensors = weights.from_params(fmt, model_config, jax.device_get(params))
  with staged_directory(out, force, _is_hf) as staging:
    write_model(staging, hf, tensors)
  return hf


def export_run(run_dir, out, fmt="official", step=None, force=False):
  """Write the lpcjax run ``run_dir``'s checkpoint (latest, or ``step``) as a Hugging Face
  directory ``out`` in format ``fmt`` ("official" or "fla"). Returns the config.json dict."""
  formats.hf_config(fmt, read_run_config(run_dir).model)  # refuse before restoring anything
  run = load_run(run_dir, step=step)
  return save_hf(out, fmt, run.config.model, run.params, force=force,
                 source_config=_source_config(run_dir))


def _source_config(run_dir):
  """The config.json an imported run came from; None for runs lpcjax trained itself."""
  try:
    with open(os.path.join(run_dir, SOURCE_CONFIG)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None
