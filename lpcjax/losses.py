"""Losses shared by the training harness and evaluation."""

import jax.numpy as jnp
import optax


def masked_cross_entropy(logits, targets, loss_mask):
  """Per-position cross-entropy [batch, seq] (float32) times the mask, and argmax hits."""
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return losses * loss_mask, hits * loss_mask


def lm_loss(apply_fn, params, batch):
  """Language-model loss: mean cross-entropy over the positions batch["loss_mask"] marks.

  The loss interface of every family: ``loss(apply_fn, params, batch) -> (loss, metrics)``,
  metrics holding at least "loss", "accuracy" and "count" (the number of scored positions, which
  evaluation uses to weigh batches exactly).
  """
  logits = apply_fn({"params": params}, batch["inputs"], segment_ids=batch.get("segment_ids"))
  losses, hits = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  count = jnp.maximum(batch["loss_mask"].sum(), 1.0)
  loss = losses.sum() / count
  return loss, {"loss": loss, "accuracy": hits.sum() / count, "count": batch["loss_mask"].sum()}
