"""The reusable pieces of training: loss, optimizer, state, jitted train and eval steps.

The harness only assumes the LM calling convention of ``lpcjax.models.registry.Family``
and batches {inputs, targets, loss_mask} (loss_mask marks the scored positions).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax.experimental import checkify


class TrainState(train_state.TrainState):
  pass


def masked_cross_entropy(logits, targets, loss_mask):
  """Per-position cross-entropy [batch, seq] (float32) times the mask, and argmax hits."""
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return losses * loss_mask, hits * loss_mask


def decay_mask(params):
  """Weight decay on matrices only (kernels, embeddings): not on norms, biases or gate biases."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) in ("kernel", "embedding"), params)


def make_optimizer(train_cfg):
  """AdamW (b1, b2, decoupled weight decay) after global-norm clipping; linear warmup, cosine."""
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train_cfg.learning_rate, warmup_steps=train_cfg.warmup_steps,
      decay_steps=max(train_cfg.steps, train_cfg.warmup_steps + 1), end_value=train_cfg.min_learning_rate)
  return optax.chain(
      optax.clip_by_global_norm(train_cfg.grad_clip),
      optax.adamw(schedule, b1=train_cfg.adam_b1, b2=train_cfg.adam_b2,
                  weight_decay=train_cfg.weight_decay, mask=decay_mask)), schedule


def init_params(model, seq_len, seed):
  """Unboxed float params (logical axis names stripped; see nn.get_partition_spec for them)."""
  if getattr(model.config, "debug_checks", False):  # value checks belong to apply, not init
    model = model.clone(config=dataclasses.replace(model.config, debug_checks=False))
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  return nn.meta.unbox(model.init(jax.random.PRNGKey(seed), tokens)["params"])


def create_train_state(model, config):
  optimizer, _ = make_optimizer(config.train)
  params = init_params(model, config.data.seq_len, config.train.seed)
  return TrainState.create(apply_fn=model.apply, params=params, tx=optimizer)


def _loss_and_metrics(params, apply_fn, batch):
  logits = apply_fn({"params": params}, batch["inputs"], segment_ids=batch.get("segment_ids"))
  losses, hits = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  count = jnp.maximum(batch["loss_mask"].sum(), 1.0)
  loss = losses.sum() / count
  return loss, {"loss": loss, "accuracy": hits.sum() / count}


def train_step(state, batch):
  """One AdamW step on the mean masked cross-entropy. Returns (state, metrics)."""
  grad_fn = jax.value_and_grad(_loss_and_metrics, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, state.apply_fn, batch)
  metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
  return state.apply_gradients(grads=grads), metrics


def eval_step(params, apply_fn, batch):
  """Sums (not means) so that batches can be accumulated exactly."""
  logits = apply_fn({"params": params}, batch["inputs"], segment_ids=batch.get("segment_ids"))
  losses, hits = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  return {"loss_sum": losses.sum(), "hits": hits.sum(), "count": batch["loss_mask"].sum()}


def jit_steps(debug_checks=False):
  """Compiled (train_step, eval_step). With debug_checks, value checks inside the model
  (lpcjax.kernels' debug mode) raise on the host after the step that failed them."""
  train = jax.jit(train_step, donate_argnums=0)
  evaluate = jax.jit(eval_step, static_argnums=1)
  if not debug_checks:
    return train, evaluate
  checked_train = jax.jit(checkify.checkify(train_step, errors=checkify.user_checks))
  checked_eval = jax.jit(checkify.checkify(eval_step, errors=checkify.user_checks), static_argnums=1)

  def train_checked(state, batch):
    err, out = checked_train(state, batch)
    err.throw()
    return out

  def eval_checked(params, apply_fn, batch):
    err, out = checked_eval(params, apply_fn, batch)
    err.throw()
    return out

  return train_checked, eval_checked
