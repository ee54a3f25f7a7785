"""The reusable pieces of training: loss, optimizer, sharded state, jitted train and eval steps.

The harness never branches on the model family: a family supplies ``loss(apply_fn, params,
batch) -> (loss, metrics)`` (``lpcjax.losses.lm_loss`` for language models, see
``lpcjax.models.registry.Family``).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lpcjax.losses import lm_loss


class TrainState(train_state.TrainState):
  pass


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
                  weight_decay=train_cfg.weight_decay, mask=decay_mask))


def _init_model(model):
  """Value checks (debug_checks) belong to apply, not init: init without them."""
  if getattr(model.config, "debug_checks", False):
    return model.clone(config=dataclasses.replace(model.config, debug_checks=False))
  return model


def init_params(model, seq_len, seed):
  """Unboxed float params (logical axis names stripped; see nn.get_partition_spec for them)."""
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  return nn.meta.unbox(_init_model(model).init(jax.random.PRNGKey(seed), tokens)["params"])


def state_shardings(model, config, optimizer, mesh, rules):
  """(abstract TrainState, its NamedShardings): params by their logical names under ``rules``,
  optimizer moments like their params, everything else replicated. ``optimizer`` must be the
  one the state is created with (it is part of the TrainState's static structure)."""
  tokens = jnp.zeros((1, config.data.seq_len), jnp.int32)
  boxed = jax.eval_shape(_init_model(model).init, jax.random.PRNGKey(0), tokens)["params"]
  param_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
  abstract = jax.eval_shape(lambda: _create(model, config, optimizer))
  replicated = NamedSharding(mesh, P())
  opt_shardings = optax.tree_map_params(optimizer, lambda _, sharding: sharding, abstract.opt_state,
                                        param_shardings, transform_non_params=lambda _: replicated)
  shardings = abstract.replace(step=replicated, params=param_shardings, opt_state=opt_shardings)
  return abstract, shardings


def _create(model, config, optimizer):
  params = init_params(model, config.data.seq_len, config.train.seed)
  return TrainState.create(apply_fn=model.apply, params=params, tx=optimizer)


def create_train_state(model, config, optimizer=None, shardings=None):
  """A fresh TrainState, built directly into ``shardings`` (never materialized unsharded)."""
  optimizer = make_optimizer(config.train) if optimizer is None else optimizer
  return jax.jit(lambda: _create(model, config, optimizer), out_shardings=shardings)()


def _global_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def train_step(state, batch, loss_fn=lm_loss, accum_steps=1):
  """One optimizer step on ``batch`` (split into ``accum_steps`` micro-batches whose gradients
  are averaged). A non-finite loss or gradient leaves the state unchanged (metrics["finite"]=0)."""
  grad_fn = jax.value_and_grad(lambda p, b: loss_fn(state.apply_fn, p, b), has_aux=True)
  if accum_steps == 1:
    (_, metrics), grads = grad_fn(state.params, batch)
  else:
    micro = jax.tree.map(lambda x: x.reshape((accum_steps, -1) + x.shape[1:]), batch)

    def accumulate(total, micro_batch):
      (_, metrics), grads = grad_fn(state.params, micro_batch)
      return jax.tree.map(jnp.add, total, (grads, metrics)), None

    (_, metrics_shape), grads_shape = jax.eval_shape(grad_fn, state.params, jax.tree.map(lambda x: x[0], micro))
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), (grads_shape, metrics_shape))
    (grads, metrics), _ = jax.lax.scan(accumulate, zeros, micro)
    grads, metrics = jax.tree.map(lambda x: x / accum_steps, (grads, metrics))
  grad_norm = _global_norm(grads)
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
  updated = state.apply_gradients(grads=grads)
  state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, state)
  return state, {**metrics, "grad_norm": grad_norm, "finite": finite.astype(jnp.float32)}


def eval_step(params, apply_fn, batch, loss_fn=lm_loss):
  """Sums (not means) so that batches can be accumulated exactly."""
  _, metrics = loss_fn(apply_fn, params, batch)
  count = metrics["count"]
  return {"loss_sum": metrics["loss"] * count, "hits": metrics["accuracy"] * count, "count": count}
