"""Per-token loss L(i): the mean cross-entropy at each context position i (the FoX paper's
central diagnostic), and perplexity over the first L positions.

Sums are accumulated on the host in float64, per position, over every evaluation sequence;
a position's mean counts only the sequences that score it (the loss mask: all of them for
text). Optionally each sequence is rolled by a random offset first (the paper's protocol), so
that every position sees text of the same difficulty on average.
"""

import dataclasses
import math
import sys

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
  """What ``per_token_losses`` gathers, float64: loss sums and scored-token counts per position
  [T]; each sequence's mean loss [N]; and each sequence's loss sums and scored-token counts in
  bins of ``bin_width`` positions [N, ceil(T / bin_width)]."""

  sums: np.ndarray
  counts: np.ndarray
  sequence_means: np.ndarray
  bin_sums: np.ndarray
  bin_counts: np.ndarray
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
    return masked_cross_entropy(logits, batch["targets"], scored_positions(batch))[0]

  rng = None if roll_seed is None else np.random.default_rng(roll_seed)
  totals, sequence_means, bin_sums, bin_counts = None, [], [], []
  # no bar where stderr is a file: it would be a line per batch
  for batch in tqdm(batches, desc="per-token loss", total=total, disable=not (progress and sys.stderr.isatty())):
    if rng is not None:
      batch = roll_batch(batch, rng)
    placed = {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
    losses = np.asarray(position_losses(params, placed), np.float64)
    mask = np.asarray(scored_positions(batch), np.float64)
    if totals is None:
      totals = [np.zeros(losses.shape[1]) for _ in range(2)]
    for total_, value in zip(totals, (losses, mask)):
      total_ += value.sum(0)
    real = mask.sum(1) > 0
    sequence_means.extend(losses.sum(1)[real] / mask.sum(1)[real])
    bin_sums.extend(_binned(losses[real], bin_width))
    bin_counts.extend(_binned(mask[real], bin_width))
  if totals is None:
    raise ValueError("per-token loss: the evaluation data gave no batch")
  return PerTokenTotals(*totals, np.asarray(sequence_means), np.asarray(bin_sums), np.asarray(bin_counts),
                        bin_width)


def _binned(values, width):
  """[rows, T] -> [rows, ceil(T / width)]: sums over bins of ``width`` positions."""
  pad = -values.shape[1] % width
  return np.pad(values, ((0, 0), (0, pad))).reshape(len(values), -1, width).sum(-1)


def confidence_band(totals):
  """Per bin: the curve's value there (the loss over all scored tokens of the bin, a ratio
  Σ sums / Σ counts over sequences) and its standard error across sequences (the ratio
  estimator's: sqrt(Σ_s (sum_s - R count_s)² / (n (n - 1))) / mean count, over the n sequences
  that score the bin): how far the curve could move with other sequences."""
  sums, counts = totals.bin_sums, totals.bin_counts
  scored = counts > 0
  n = scored.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = sums.sum(0) / counts.sum(0)
    residuals = np.where(scored, sums - mean * counts, 0.0)
    stderr = np.sqrt((residuals ** 2).sum(0) / (n * (n - 1))) / (counts.sum(0) / n)
  starts = np.arange(sums.shape[1]) * totals.bin_width
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
    scored = counts[:length].sum()
    mean = float(sums[:length].sum() / scored) if scored else None  # None: nothing scored that early
    result["by_context_length"][str(length)] = {"loss": mean, "perplexity": None if mean is None else math.exp(mean)}
  result["perplexity"] = math.exp(result["mean_loss"])
  if tokens_per_word is not None:
    result["tokens_per_word"] = tokens_per_word
    result["word_perplexity"] = math.exp(result["mean_loss"] * tokens_per_word)
  return result
