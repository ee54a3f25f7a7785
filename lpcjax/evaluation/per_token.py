"""Per-token loss L(i): the mean cross-entropy at each context position i (the FoX paper's
central diagnostic), and perplexity over the first L positions.

Sums are accumulated on the host in float64, per position, over every evaluation sequence;
a position's mean counts only the sequences that score it (the loss mask: all of them for
text). Optionally each sequence is rolled by a random offset first (the paper's protocol), so
that every position sees text of the same difficulty on average.
"""

import dataclasses
import math
import warnings

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from lpcjax.losses import masked_cross_entropy, scored_positions


def context_lengths(eval_len, first=None):
  """first, 2 first, 4 first, ... below eval_len, and eval_len itself. ``first`` defaults to 512,
  or for short evaluations the power of two at or above eval_len / 8 (so a curve has points)."""
  lengths = []
  length = first or min(512, 2 ** math.ceil(math.log2(max(eval_len / 8, 1))))
  while length < eval_len:
    lengths.append(length)
    length *= 2
  return lengths + [eval_len]


def roll_batch(batch, rng):
  """Roll every sequence (inputs and targets alike) by its own random offset."""
  out = {}
  shifts = rng.integers(0, batch["inputs"].shape[1], size=batch["inputs"].shape[0])
  for key, value in batch.items():
    out[key] = np.stack([np.roll(row, shift) for row, shift in zip(value, shifts)])
  return out


def sequence_logits(model, params, inputs, segment_ids=None):
  """Logits [batch, T, vocab] at every position of ``inputs`` [batch, T]: the model's own
  forward pass. Families whose models read fixed windows (``sith``) give their evaluator
  another function of this signature."""
  return model.apply({"params": params}, inputs, segment_ids=segment_ids)


@dataclasses.dataclass
class PerTokenTotals:
  """What ``per_token_losses`` gathers, float64: loss sums, scored-token counts and argmax hits
  per position [T]; each sequence's mean loss [N]; and each sequence's mean loss in bins of
  ``bin_width`` positions [N, ceil(T / bin_width)] (NaN where a bin scores nothing)."""

  sums: np.ndarray
  counts: np.ndarray
  hits: np.ndarray
  sequence_means: np.ndarray
  bin_means: np.ndarray
  bin_width: int


def per_token_losses(model, params, batches, mesh, *, logits_fn=sequence_logits, roll_seed=None,
                     progress=True, total=None, bin_width=64):
  """Run the model over ``batches`` (an iterable of numpy batch dicts of one shape; padding
  examples with ``valid`` = 0 count nowhere) and return their PerTokenTotals. One compilation
  per shape."""
  sharding = NamedSharding(mesh, P(("data", "fsdp")))

  @jax.jit
  def position_losses(params, batch):
    logits = logits_fn(model, params, batch["inputs"], batch.get("segment_ids"))
    return masked_cross_entropy(logits, batch["targets"], scored_positions(batch))

  rng = None if roll_seed is None else np.random.default_rng(roll_seed)
  totals, sequence_means, bin_means = None, [], []
  for batch in tqdm(batches, desc="per-token loss", total=total, disable=not progress):
    if rng is not None:
      batch = roll_batch(batch, rng)
    placed = {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
    losses, hits = position_losses(params, placed)
    losses, hits = np.asarray(losses, np.float64), np.asarray(hits, np.float64)
    mask = np.asarray(scored_positions(batch), np.float64)
    if totals is None:
      totals = [np.zeros(losses.shape[1]) for _ in range(3)]
    for total_, value in zip(totals, (losses, mask, hits)):
      total_ += value.sum(0)
    real = mask.sum(1) > 0
    sequence_means.extend(losses.sum(1)[real] / mask.sum(1)[real])
    bin_means.extend(_binned_means(losses[real], mask[real], bin_width))
  if totals is None:
    raise ValueError("per-token loss: the evaluation data gave no batch")
  return PerTokenTotals(*totals, np.asarray(sequence_means), np.asarray(bin_means), bin_width)


def _binned_means(losses, mask, width):
  """[rows, ceil(T / width)]: each row's mean loss over the scored positions of each bin."""
  pad = -losses.shape[1] % width
  losses, mask = (np.pad(x, ((0, 0), (0, pad))).reshape(len(x), -1, width).sum(-1) for x in (losses, mask))
  with np.errstate(invalid="ignore", divide="ignore"):
    return losses / mask


def confidence_band(totals):
  """Per bin: the mean over sequences of their bin means, and its standard error (std / sqrt n,
  n = sequences scored in the bin): how far the curve could move with other sequences."""
  means = totals.bin_means
  n = np.isfinite(means).sum(0)
  with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # bins no sequence scores
    mean = np.nanmean(means, axis=0)
    stderr = np.nanstd(means, axis=0, ddof=1) / np.sqrt(n)
  starts = np.arange(means.shape[1]) * totals.bin_width
  ends = np.minimum(starts + totals.bin_width, len(totals.sums))
  finite = lambda xs: [float(x) if np.isfinite(x) else None for x in xs]
  return {"bin_width": totals.bin_width, "centers": ((starts + ends + 1) / 2).tolist(), "mean": finite(mean),
          "stderr": finite(stderr), "sequences": n.tolist()}


def summarize(sums, counts, num_sequences, tokens_per_word=None):
  """The JSON-ready result: the curve, counts, and mean loss / perplexity over the first L."""
  with np.errstate(invalid="ignore", divide="ignore"):
    curve = sums / counts
  eval_len = len(sums)
  result = {"eval_len": eval_len, "num_sequences": int(num_sequences), "num_tokens": int(counts.sum()),
            "mean_loss": float(sums.sum() / counts.sum()),
            "per_token_loss": [None if not np.isfinite(x) else float(x) for x in curve],
            "per_token_count": counts.tolist(),
            "by_context_length": {}}
  for length in context_lengths(eval_len):
    mean = float(sums[:length].sum() / max(counts[:length].sum(), 1.0))
    result["by_context_length"][str(length)] = {"loss": mean, "perplexity": math.exp(mean)}
  result["perplexity"] = math.exp(result["mean_loss"])
  if tokens_per_word is not None:
    result["tokens_per_word"] = tokens_per_word
    result["word_perplexity"] = math.exp(result["mean_loss"] * tokens_per_word)
  return result
