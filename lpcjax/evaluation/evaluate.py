"""Evaluate a run directory: per-token loss curve, perplexity by context length, probes, plots."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np

from lpcjax.data import DataError, load_gpt2_tokenizer, load_token_file, make_dataset, tokenize_files
from lpcjax.data.prepare import read_documents, tokenizer_hash

from .needle import needle_grid
from .per_token import per_token_losses, sequence_logits, summarize
from .plots import plot_needle, plot_per_token, plot_perplexity
from .recall import recall_by_distance
from .runs import load_run

NEEDLE_DEPTHS = tuple(i / 10 for i in range(11))


def _eval_data(config, eval_len, batch_size, data_files, data_tokens):
  """The data config for evaluation: the run's own eval data unless files/tokens are given."""
  # Long sequences, no stride: windowed models (sith) slide over them in sequence_logits.
  data = dataclasses.replace(config.data, seq_len=eval_len, batch_size=batch_size, window_stride=None)
  if data_files:
    data = dataclasses.replace(data, kind="text", train_files=tuple(data_files), eval_files=tuple(data_files))
  elif data_tokens:
    data = dataclasses.replace(data, kind="tokens", train_tokens=data_tokens, eval_tokens=data_tokens)
  if data.kind != "mqar" and config.model.vocab_size < 50257:
    raise DataError(f"tokenizer mismatch: the run's model has {config.model.vocab_size} tokens "
                    "(trained on MQAR), the data is GPT-2 text (50257)")
  if data.kind == "tokens":
    _, meta = load_token_file(data.eval_tokens)
    expected = tokenizer_hash(load_gpt2_tokenizer(config.data.tokenizer_file))
    if meta.get("tokenizer_sha256") != expected:
      raise DataError(f"tokenizer mismatch: {data.eval_tokens} was prepared with another tokenizer")
  return data


def _tokens_per_word(data):
  if data.kind == "tokens":
    _, meta = load_token_file(data.eval_tokens)
    return meta["num_tokens"] / meta["num_words"] if meta.get("num_words") else None
  if data.kind == "text":
    tokens, _ = tokenize_files(data.eval_files, load_gpt2_tokenizer(data.tokenizer_file))
    words = sum(len(text.split()) for path in data.eval_files for text in read_documents(path))
    return len(tokens) / words if words else None
  return None


def label_of(config, params):
  size = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)) / 1e6
  cfg = config.model
  if cfg.family == "sith":
    kind = f"delta L={cfg.num_filters}" if cfg.delta_pulse else f"L={cfg.num_filters}, k={cfg.k:g}"
  else:
    kind = cfg.block + (", RoPE" if cfg.use_rope else "")
  return f"{cfg.family} ({kind}, {size:.1f}M)"


def evaluate_run(run_dir, *, eval_len=None, data_files=None, data_tokens=None, batch_size=None,
                 max_sequences=64, roll=True, seed=0, needle=False, needle_lengths=None,
                 haystack_files=None, progress=True):
  """Everything eval.py reports for one run, as a JSON-ready dict."""
  config, model, params, mesh, rules = load_run(run_dir)
  train_len = config.data.seq_len
  eval_len = eval_len or 4 * train_len
  data_ways = mesh.shape["data"] * mesh.shape["fsdp"]
  batch_size = batch_size or data_ways
  if batch_size % data_ways:
    raise DataError(f"--batch-size {batch_size} is not divisible by the {data_ways} data devices")
  data = _eval_data(config, eval_len, batch_size, data_files, data_tokens)
  dataset = make_dataset(data, seed, "eval")
  num_batches = min(len(dataset), -(-max_sequences // batch_size))
  if num_batches == 0:
    raise DataError(f"evaluation data too short: fewer than {batch_size} windows of eval_len + 1 = "
                    f"{eval_len + 1} tokens")
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    apply = jax.jit(lambda p, tokens: sequence_logits(model, p, tokens))
    logits_fn = lambda tokens: apply(params, np.asarray(tokens))
    sums, counts, _ = per_token_losses(model, params, (dataset[i] for i in range(num_batches)), mesh,
                                       roll_seed=seed if roll and data.kind != "mqar" else None,
                                       progress=progress, total=num_batches)
    result = summarize(sums, counts, num_batches * batch_size, _tokens_per_word(data))
    result.update(run=os.path.abspath(run_dir), label=label_of(config, params), train_len=train_len,
                  family=config.model.family, data_kind=data.kind, rolled=bool(roll and data.kind != "mqar"))
    if data.kind == "mqar":
      result["recall_by_distance"] = recall_by_distance(logits_fn, (dataset[i] for i in range(num_batches)))
    if needle:
      files = haystack_files or data_files or data.eval_files
      if not files:
        raise DataError("--needle needs haystack text: give --haystack FILE ... (or --data)")
      tokenizer = load_gpt2_tokenizer(config.data.tokenizer_file)
      haystack, _ = tokenize_files(files, tokenizer)
      lengths = needle_lengths or [n for n in (1024 * 2**k for k in range(10)) if n <= eval_len] or [eval_len]
      grid = needle_grid(logits_fn, haystack, tokenizer, lengths, NEEDLE_DEPTHS)
      result["needle"] = {"lengths": list(lengths), "depths": list(NEEDLE_DEPTHS), "accuracy": grid.tolist()}
  return result


def write_outputs(results, out_dir, window=64, log_x=False):
  """per_token.json per run (or compare.json), and the PNG plots."""
  os.makedirs(out_dir, exist_ok=True)
  name = "per_token.json" if len(results) == 1 else "compare.json"
  with open(os.path.join(out_dir, name), "w") as f:
    json.dump(results if len(results) > 1 else results[0], f, indent=1)
  runs = [(r["label"], r, r["train_len"]) for r in results]
  plot_per_token(runs, os.path.join(out_dir, "per_token_loss.png"), window=window, log_x=log_x)
  plot_perplexity(runs, os.path.join(out_dir, "perplexity_vs_context.png"))
  for r in results:
    if "needle" in r:
      suffix = "" if len(results) == 1 else "_" + os.path.basename(r["run"].rstrip("/"))
      plot_needle(np.array(r["needle"]["accuracy"]), r["needle"]["lengths"], r["needle"]["depths"],
                  os.path.join(out_dir, f"needle{suffix}.png"), title=f"Needle in a haystack: {r['label']}")
