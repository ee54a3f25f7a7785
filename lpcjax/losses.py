"""Losses shared by the training harness and evaluation.

A family's loss is called as ``loss(apply_fn, params, batch, *, rng, step, mutable, train)`` and
returns ``(loss, metrics, new_mutable)``:
* ``loss``: the scalar that training differentiates (a mean);
* ``metrics``: ``{name: (sum, weight)}``, float32 scalars. Their means are sum / weight; the
  harness adds sums and weights over micro-batches, devices and evaluation batches (in float64
  on the host), so every mean is exact whatever the batching. ``metrics["loss"]`` is required,
  with ``loss == sum / weight``: its weight also weighs micro-batches in gradient accumulation;
* ``new_mutable``: the updated mutable collections ({} for families without any);
* ``rng`` is a key derived from the seed and the step (unused by deterministic families),
  ``mutable`` the current collections (e.g. {"batch_stats": ...}), ``train`` False in evaluation.
"""

import jax.numpy as jnp
import optax


def masked_cross_entropy(logits, targets, loss_mask):
  """Per-position cross-entropy [batch, seq] (float32) times the mask, and argmax hits."""
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return losses * loss_mask, hits * loss_mask


def scored_positions(batch):
  """The loss mask [batch, seq], zero on the padding examples of an evaluation batch."""
  mask = batch["loss_mask"].astype(jnp.float32)
  if "valid" in batch:
    mask = mask * batch["valid"].astype(jnp.float32)[:, None]
  return mask


def lm_loss(apply_fn, params, batch, **_):
  """Language-model loss: mean cross-entropy over the positions the loss mask marks.

  Models that predict only the last m positions of a window (``sith``: logits [batch, m, vocab])
  are scored on the last m targets.
  """
  logits = apply_fn({"params": params}, batch["inputs"], segment_ids=batch.get("segment_ids"))
  scored = logits.shape[1]
  mask = scored_positions(batch)[:, -scored:]
  losses, hits = masked_cross_entropy(logits, batch["targets"][:, -scored:], mask)
  count = mask.sum()
  loss = losses.sum() / jnp.maximum(count, 1.0)
  return loss, {"loss": (losses.sum(), count), "accuracy": (hits.sum(), count)}, {}
