"""The reusable pieces of training: optimizer, sharded state, jitted train and eval steps.

The harness never branches on the model family: the family supplies the example inputs for
init, the loss (see ``lpcjax.losses`` for its contract), the mutable collections and rng streams
(``lpcjax.models.Family``).
"""

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lpcjax.losses import lm_loss


class TrainState(train_state.TrainState):
  """Params, optimizer state, step, and the model's mutable collections (``{}`` for models
  without any; ``{"batch_stats": ...}`` for BatchNorm), checkpointed together."""

  mutable: Any = flax.struct.field(default_factory=dict)


def decay_mask(params):
  """Weight decay on matrices only (kernels, embeddings): not on norms, biases or gate biases."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) in ("kernel", "embedding"), params)


def path_name(path):
  """A tree path -> 'layers/controller/ratio_logit'."""
  return "/".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)


def scale_by_path(rules):
  """A stateless transform multiplying each update by the factor of the first rule
  ("PATTERN=FACTOR") whose PATTERN is contained in the parameter's path (1 if none matches)."""
  parsed = [(pattern, float(factor)) for pattern, _, factor in (rule.partition("=") for rule in rules)]

  def factor_of(path):
    name = path_name(path)
    return next((factor for pattern, factor in parsed if pattern in name), 1.0)

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda path, u: u * factor_of(path), updates), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def _clipped_adam(train_cfg, schedule, b2, clip, decay):
  return [optax.clip_by_global_norm(clip),
          optax.adamw(schedule, b1=train_cfg.adam_b1, b2=b2, weight_decay=decay, mask=decay_mask)]


def group_labels(groups):
  """params -> the same tree of each parameter's group name: the first of ``groups`` (each a
  ``lpcjax.config.ParameterGroup``) one of whose patterns its path contains, else "rest"."""
  def label(path, _):
    name = path_name(path)
    return next((group.name for group in groups if any(p in name for p in group.patterns)), "rest")
  return lambda params: jax.tree_util.tree_map_with_path(label, params)


def learning_rate_schedule(train_cfg):
  """The learning rate of each update: linear warm-up to ``learning_rate``, then cosine to
  ``min_learning_rate`` at ``steps`` (before a family's per-parameter scales)."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train_cfg.learning_rate, warmup_steps=train_cfg.warmup_steps,
      decay_steps=max(train_cfg.steps, train_cfg.warmup_steps + 1), end_value=train_cfg.min_learning_rate)


def make_optimizer(train_cfg):
  """AdamW (b1, b2, decoupled weight decay) after global-norm clipping; linear warmup, cosine.
  What a family adds is declared by its train config (``Family.train_config_cls``): its
  ``parameter_groups()`` each become a group of their own (optax.multi_transform) clipped on
  their own, with their own Adam b2 and weight decay; then the per-parameter scales of its
  ``lr_scale_rules()``. Each extra is added only if declared, so that the optimizer state of
  every other run keeps its structure (and old checkpoints restore)."""
  schedule = learning_rate_schedule(train_cfg)
  parts = _clipped_adam(train_cfg, schedule, train_cfg.adam_b2, train_cfg.grad_clip, train_cfg.weight_decay)
  groups = train_cfg.parameter_groups()
  if groups:
    transforms = {group.name: optax.chain(*_clipped_adam(train_cfg, schedule, group.adam_b2, group.grad_clip,
                                                         group.weight_decay)) for group in groups}
    parts = [optax.multi_transform({"rest": optax.chain(*parts), **transforms}, group_labels(groups))]
  if train_cfg.lr_scale_rules():
    parts.append(scale_by_path(train_cfg.lr_scale_rules()))
  return optax.chain(*parts)


def _split_variables(family, variables):
  variables = nn.meta.unbox(variables)
  return variables["params"], {name: variables[name] for name in family.mutable if name in variables}


def _create(family, model, config, optimizer):
  params, mutable = _split_variables(family, family.init_variables(model, config.data, config.train.seed))
  return TrainState.create(apply_fn=model.apply, params=params, tx=optimizer, mutable=mutable)


def variable_shardings(family, model, config, mesh, rules):
  """((abstract params, abstract mutable collections), (their NamedShardings)): by their
  logical names under ``rules``, replicated where they have none. What evaluation restores."""
  boxed = jax.eval_shape(lambda: family.init_variables(model, config.data, config.train.seed))
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
  # The boxes' own unbox() would apply their sharding constraint, which needs a trace.
  boxes = lambda x: isinstance(x, nn.meta.AxisMetadata)
  unboxed = jax.tree.map(lambda x: x.unbox(apply_constraint=False) if boxes(x) else x, boxed, is_leaf=boxes)
  return _split_variables(family, unboxed), _split_variables(family, shardings)


def state_shardings(family, model, config, optimizer, mesh, rules):
  """(abstract TrainState, its NamedShardings): params and mutable collections by their logical
  names under ``rules`` (replicated where they have none), optimizer moments like their params,
  everything else replicated. ``optimizer`` must be the one the state is created with (it is
  part of the TrainState's static structure)."""
  _, (param_shardings, mutable_shardings) = variable_shardings(family, model, config, mesh, rules)
  abstract = jax.eval_shape(lambda: _create(family, model, config, optimizer))
  replicated = NamedSharding(mesh, P())
  # A parameter group (optax.multi_transform) holds an empty MaskedNode for each parameter of
  # the other group: it stays as it is.
  masked = lambda leaf: isinstance(leaf, optax.MaskedNode)
  opt_shardings = optax.tree_map_params(optimizer, lambda leaf, sharding: leaf if masked(leaf) else sharding,
                                        abstract.opt_state, param_shardings,
                                        transform_non_params=lambda _: replicated, is_leaf=masked)
  shardings = abstract.replace(step=replicated, params=param_shardings, opt_state=opt_shardings,
                               mutable=mutable_shardings)
  return abstract, shardings


def create_train_state(family, model, config, optimizer=None, shardings=None):
  """A fresh TrainState, built directly into ``shardings`` (never materialized unsharded)."""
  optimizer = make_optimizer(config.train) if optimizer is None else optimizer
  return jax.jit(lambda: _create(family, model, config, optimizer), out_shardings=shardings)()


def _global_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


TRAINING_STREAM = 2**31 - 1  # keeps training keys apart from the init keys folded from the seed


def step_rng(seed, step):
  """The training key of ``step``: a function of (seed, step) only, so resume stays bitwise."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), TRAINING_STREAM), step)


def micro_batches(batch, accum_steps):
  """[B, ...] -> [K, B/K, ...] with micro-batch k = rows k, K + k, 2K + k, ...: each device's
  contiguous block of rows splits into K local pieces, so no data moves between devices (taking
  contiguous blocks of B/K rows instead would gather rows across the data-sharded batch axis)."""
  def split(x):
    local = x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:])
    local = nn.with_logical_constraint(local, ("activation_batch",) + (None,) * (local.ndim - 1))
    return jnp.swapaxes(local, 0, 1)
  return jax.tree.map(split, batch)


def train_step(state, batch, loss_fn=lm_loss, accum_steps=1, seed=0):
  """One optimizer step on ``batch``, optionally as ``accum_steps`` micro-batches whose gradients
  are weighted by their ``metrics["loss"]`` weights (exact when the micro-batches score different
  numbers of positions). A non-finite loss or gradient leaves the state unchanged (finite = 0).
  Returns (state, metrics as {name: (sum, weight)})."""
  rng = step_rng(seed, state.step)

  def loss_of(params, micro_batch, mutable, key, *, weighted):
    loss, metrics, new_mutable = loss_fn(state.apply_fn, params, micro_batch, rng=key, step=state.step,
                                         mutable=mutable, train=True)
    if weighted:  # the micro-batch's loss sum: sums of micro-batches add up to the batch's
      loss = loss * jax.lax.stop_gradient(metrics["loss"][1])
    return loss, (metrics, new_mutable)

  if accum_steps == 1:
    grad_fn = jax.value_and_grad(functools.partial(loss_of, weighted=False), has_aux=True)
    (_, (metrics, mutable)), grads = grad_fn(state.params, batch, state.mutable, rng)
  else:
    grad_fn = jax.value_and_grad(functools.partial(loss_of, weighted=True), has_aux=True)

    def accumulate(carry, inputs):
      grads, metrics, mutable = carry
      index, micro_batch = inputs
      (_, (new_metrics, mutable)), new_grads = grad_fn(state.params, micro_batch, mutable,
                                                       jax.random.fold_in(rng, index))
      return (jax.tree.map(jnp.add, grads, new_grads), jax.tree.map(jnp.add, metrics, new_metrics), mutable), None

    micro = micro_batches(batch, accum_steps)
    first = jax.tree.map(lambda x: x[0], micro)
    (_, (metrics_shape, _)), grads_shape = jax.eval_shape(grad_fn, state.params, first, state.mutable, rng)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), (grads_shape, metrics_shape))
    (grads, metrics, mutable), _ = jax.lax.scan(accumulate, (*zeros, state.mutable),
                                                (jnp.arange(accum_steps), micro))
    grads = jax.tree.map(lambda g: g / jnp.maximum(metrics["loss"][1], 1e-12), grads)
  grad_norm = _global_norm(grads)
  finite = jnp.isfinite(metrics["loss"][0]) & jnp.isfinite(grad_norm)
  updated = state.apply_gradients(grads=grads)
  if state.mutable:
    updated = updated.replace(mutable=mutable)
  state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, state)
  one = jnp.float32(1.0)
  return state, {**metrics, "grad_norm": (grad_norm, one), "finite": (finite.astype(jnp.float32), one)}


def eval_step(state, batch, loss_fn=lm_loss):
  """The loss's metrics {name: (sum, weight)} on ``batch`` in evaluation mode (``train=False``,
  mutable collections read, not updated): sums, so that batches can be accumulated exactly."""
  _, metrics, _ = loss_fn(state.apply_fn, state.params, batch, rng=jax.random.PRNGKey(0), step=state.step,
                          mutable=state.mutable, train=False)
  return metrics
