"""The lpcsm family: causality, streaming = parallel, the ablation switches, mHC's reduction to a
plain residual block, the loss against a direct computation, the controller under training,
and the 158M config's parameter count."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpcjax.config import ConfigError
from lpcjax.models import LPCSM, LPCSMConfig
from lpcjax.models.lpcsm import init_state, lpcsm_loss

TINY = LPCSMConfig(vocab_size=61, d_model=32, num_layers=2, num_heads=2, mlp_multiple_of=32, attention_window=6,
                   chunk_size=4, memory_dim=16, num_streams=3, attention_impl="xla")
SEQ = 24


def _tokens(seed=0, batch=2, seq=SEQ, vocab=61):
  return jax.random.randint(jax.random.PRNGKey(seed), (batch, seq), 0, vocab)


def _model(cfg=TINY, seed=1):
  model = LPCSM(cfg)
  variables = jax.jit(model.init)(jax.random.PRNGKey(seed), _tokens())
  return model, nn.meta.unbox(variables)


def _perturb(variables, seed=5, scale=0.3):
  """Move every parameter off its init (zero reads, identity mHC, ...) so each path matters."""
  leaves, tree = jax.tree.flatten(variables)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


VARIANTS = {
    "full": TINY,
    "fox_gate": dataclasses.replace(TINY, forget_gate="data_dependent"),
    "no_mhc_no_pc": dataclasses.replace(TINY, mhc=False, predictive_coding=False),
    "no_slow_no_ont": dataclasses.replace(TINY, slow_memory=False, ont=False),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_causal_and_streaming_equals_one_pass(name):
  cfg = VARIANTS[name]
  model, variables = _model(cfg)
  variables = _perturb(variables)
  tokens = _tokens()
  apply = jax.jit(model.apply)
  full = apply(variables, tokens)

  # changing token t changes no logit before t (t inside a chunk and the memory's reach)
  for t in (5, 13):
    changed = apply(variables, tokens.at[:, t].set((tokens[:, t] + 1) % cfg.vocab_size))
    np.testing.assert_array_equal(changed[:, :t], full[:, :t])
    assert np.abs(changed[:, t:] - full[:, t:]).max() > 1e-4

  state, pieces = init_state(cfg, 2), []
  for start, stop in ((0, 4), (4, 12), (12, 16), (16, 24)):  # chunks of 1 and 2 memory chunks
    logits, state = jax.jit(lambda v, x, s: model.apply(v, x, state=s))(variables, tokens[:, start:stop], state)
    pieces.append(logits)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=1e-5)
  assert int(state["position"]) == SEQ


def test_one_mhc_stream_is_the_plain_residual_model():
  with_mhc = dataclasses.replace(TINY, num_streams=1)
  model, variables = _model(with_mhc)
  params = variables["params"]
  assert "mhc" in params["layers"]
  plain_params = {**params, "layers": {k: v for k, v in params["layers"].items() if k != "mhc"}}
  plain = LPCSM(dataclasses.replace(TINY, mhc=False))
  tokens = _tokens()
  np.testing.assert_allclose(model.apply(variables, tokens), plain.apply({"params": plain_params}, tokens),
                             atol=1e-6, rtol=1e-6)


def test_each_switch_removes_its_mechanism():
  def names(cfg):
    params = jax.eval_shape(LPCSM(cfg).init, jax.random.PRNGKey(0), _tokens())["params"]
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat}

  full = names(TINY)
  expected_gone = {"mhc": "layers/mhc/", "slow_memory": "layers/memory/read_slow", "ont": "layers/memory/ont",
                   "predictive_coding": "layers/controller", "stop_head": "stop_head"}
  for field, prefix in expected_gone.items():
    assert any(n.startswith(prefix) for n in full), prefix
    reduced = names(dataclasses.replace(TINY, **{field: False}))
    assert not any(n.startswith(prefix) for n in reduced), field
    assert reduced < full


def _batch(seed=0, seq=SEQ):
  tokens = _tokens(seed, seq=seq + 1)
  tokens = tokens.at[:, 7].set(TINY.vocab_size - 1)  # a document end: a stop-head positive
  mask = jnp.ones((2, seq)).at[1, :3].set(0.0)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": mask}


def test_loss_matches_a_direct_computation():
  model, variables = _model()
  variables = _perturb(variables, scale=0.1)
  batch = _batch()
  loss, metrics, _ = lpcsm_loss(model.apply, variables["params"], batch)
  logits, extras = model.apply(variables, batch["inputs"], return_aux=True)
  mask = np.asarray(batch["loss_mask"])
  logp = jax.nn.log_softmax(logits)
  ce = -np.take_along_axis(np.asarray(logp), np.asarray(batch["targets"])[..., None], axis=-1)[..., 0]
  stop_target = (np.asarray(batch["targets"]) == TINY.vocab_size - 1).astype(np.float32)
  assert stop_target.sum() == 2
  z = np.asarray(extras["stop_logits"])
  bce = np.logaddexp(0, z) - stop_target * z  # −[y log σ(z) + (1 − y) log(1 − σ(z))]
  lm, stop = (ce * mask).sum() / mask.sum(), (bce * mask).sum() / mask.sum()
  expected = (lm + TINY.stop_loss_weight * stop + TINY.prediction_loss_weight * extras["prediction_loss"]
              + TINY.ratio_loss_weight * extras["ratio_aux"])
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(metrics["lm_loss"][0] / metrics["lm_loss"][1], lm, rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"][0] / metrics["loss"][1], loss, rtol=1e-5)
  assert 0 < float(metrics["fire_rate"][0]) < 1 and TINY.ratio_min <= float(metrics["sparse_ratio"][0]) <= TINY.ratio_max


def _train(cfg, steps=25, lr=3e-2):
  model, variables = _model(cfg)
  params = _perturb(variables, scale=0.05)["params"]
  opt = optax.adam(lr)
  opt_state = opt.init(params)
  batch = _batch()

  @jax.jit
  def step(params, opt_state):
    (_, metrics), grads = jax.value_and_grad(lambda p: lpcsm_loss(model.apply, p, batch)[:2], has_aux=True)(params)
    updates, opt_state = opt.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, metrics, grads

  ratios, first_grads = [], None
  for i in range(steps):
    params, opt_state, metrics, grads = step(params, opt_state)
    first_grads = first_grads or grads
    ratios.append(float(metrics["sparse_ratio"][0]))
  return params, ratios, first_grads


def test_controller_trains_inside_its_bounds():
  """(The fixed ratio's zero gradient is tested on the layer, tests/layers/test_lpcsm_layers.py.)"""
  cfg = dataclasses.replace(TINY, ratio_min=0.1, ratio_max=0.3, ratio_init=0.2, ratio_loss_weight=50.0)
  params, ratios, grads = _train(cfg)
  controller = grads["layers"]["controller"]
  for name in ("scale", "bias", "ratio_logit"):
    assert np.abs(controller[name]).max() > 0, name
  assert all(0.1 <= r <= 0.3 for r in ratios) and max(ratios) - min(ratios) > 1e-3


def test_bad_inputs_are_one_line_errors():
  model, variables = _model()
  with pytest.raises(ValueError, match="multiple of model.chunk_size=4"):
    model.apply(variables, _tokens(seq=10))
  with pytest.raises(ValueError, match="segment_ids"):
    model.apply(variables, _tokens(), segment_ids=jnp.zeros((2, SEQ), jnp.int32))
  with pytest.raises(ConfigError, match="model.stop_token"):
    LPCSMConfig(vocab_size=10, stop_token=10)
  with pytest.raises(ConfigError, match="ratio_init"):
    LPCSMConfig(ratio_min=0.3, ratio_init=0.2)


def test_paper_config_has_the_papers_parameter_count():
  from lpcjax import experiment as C
  cfg = C.load_experiment("configs/lpcsm.py:paper")
  shapes = jax.eval_shape(LPCSM(cfg.model).init, jax.random.PRNGKey(0), jnp.zeros((1, 64), jnp.int32))
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(shapes)))
  assert abs(count - 158_313_241) / 158_313_241 < 0.01, count


def test_configs_give_the_ablations_and_the_staged_schedule():
  from lpcjax import experiment as C
  load = lambda name: C.load_experiment(f"configs/lpcsm.py:{name}")
  a = load("tiny")
  assert a.train.init_from is None and a.train.run_name == "lpcsm_tiny"
  for variant, field in (("no_mhc", "mhc"), ("no_slow", "slow_memory"), ("no_pc", "predictive_coding"),
                         ("no_ont", "ont"), ("no_stop", "stop_head")):
    cfg = load(f"tiny_{variant}")
    assert getattr(cfg.model, field) is False and dataclasses.replace(cfg.model, **{field: True}) == a.model
  b, b_fixed, c = load("tiny_stage_b"), load("tiny_stage_b_fixed"), load("tiny_stage_c")
  assert b.train.init_from == b_fixed.train.init_from == "runs/lpcsm_tiny"
  assert b.model == a.model and b_fixed.model == dataclasses.replace(a.model, learn_ratio=False)
  assert c.train.init_from == "runs/lpcsm_tiny_stage_b" and c.data.seq_len == 2 * a.data.seq_len
  assert load("paper_stage_c").data.seq_len == 4096
  with pytest.raises(ValueError, match="unknown lpcsm config"):
    load("tiny_no_such")


def test_evaluator_logits_take_any_length():
  from lpcjax.models.lpcsm import chunk_padded_logits
  model, variables = _model()
  tokens = _tokens()
  full = model.apply(variables, tokens)
  np.testing.assert_allclose(chunk_padded_logits(model, variables["params"], tokens[:, :19]), full[:, :19],
                             atol=1e-5, rtol=1e-5)
