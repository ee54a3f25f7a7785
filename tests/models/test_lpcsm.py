"""The lpcsm family: causality, streaming = parallel, the ablation switches, mHC's reduction to a
plain residual block, the loss against a direct computation, the init (plain-model start,
gradients everywhere, firing rate ρ) and a short run (mHC and ρ move, the fixed arm keeps its
rate), lr_scales, old saved configs, and the 158M config's parameter count."""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpcjax.config import ConfigError
from lpcjax.layers import sinkhorn
from lpcjax.layers.common import bounded, bounded_init
from lpcjax.models import LPCSM, LPCSMConfig
from lpcjax.models.lpcsm import init_state, lpcsm_loss

TINY = LPCSMConfig(vocab_size=61, d_model=32, num_layers=2, num_heads=2, mlp_multiple_of=32, attention_window=6,
                   chunk_size=4, memory_dim=16, num_streams=3, attention_impl="xla",
                   position_embedding="sinusoidal")  # the option; the "no_mhc_no_pc" variant has none
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
    # FoX's gate with grouped-query attention: 4 query heads on 2 key/value heads (the window
    # cache then holds 2 heads); folded into one variant, each costs a long compile
    "fox_gate_gqa": dataclasses.replace(TINY, forget_gate="data_dependent", num_heads=4, num_kv_heads=2),
    "no_mhc_no_pc": dataclasses.replace(TINY, mhc=False, predictive_coding=False, position_embedding="none"),
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
  prediction = (np.asarray(extras["prediction_error"]) * mask).sum() / mask.sum()  # masked (issue #21)
  expected = (lm + TINY.stop_loss_weight * stop + TINY.prediction_loss_weight * prediction
              + TINY.ratio_loss_weight * extras["ratio_aux"])
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(metrics["lm_loss"][0] / metrics["lm_loss"][1], lm, rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"][0] / metrics["loss"][1], loss, rtol=1e-5)
  assert 0 < float(metrics["fire_rate"][0]) < 1
  assert TINY.ratio_min <= float(metrics["sparse_ratio"][0]) <= TINY.ratio_max
  per_layer = [float(metrics[f"fire_rate_layer{i}"][0]) for i in range(TINY.num_layers)]
  np.testing.assert_allclose(np.mean(per_layer), metrics["fire_rate"][0], rtol=1e-6)


# Issue #21: every learned part gets gradients at init, starts on the residual stream's scale
# and moves in a short run. The helpers below are compiled once and shared by these tests (CI
# time): the probe batch is large enough to measure a firing rate (4 x 96 tokens x 2 layers).
PROBE = _tokens(seed=3, batch=4, seq=96)
ZERO_AUX = dataclasses.replace(TINY, stop_loss_weight=0.0, prediction_loss_weight=0.0, ratio_loss_weight=0.0)


@functools.cache
def _probe_forward():
  """params -> (logits, extras, the final streams [batch, seq, n, d]) on PROBE."""
  model = LPCSM(TINY)

  def forward(params):
    (logits, extras), state = model.apply({"params": params}, PROBE, return_aux=True, mutable=["intermediates"])
    return logits, extras, state["intermediates"]["streams"][0]

  return jax.jit(forward)


@functools.cache
def _lm_grads():
  """params -> the gradient of the LM cross-entropy alone (auxiliary weights 0)."""
  model = LPCSM(ZERO_AUX)
  return jax.jit(jax.grad(lambda p: lpcsm_loss(model.apply, p, _batch())[0]))


@functools.cache
def _train_step(lr=3e-2):
  """(params, opt_state, ratio_update) -> (params, opt_state): one Adam step on TINY's full
  loss; ratio_update 0 freezes ρ's logit as model.learn_ratio=false does (that only cuts φ's
  gradient, tested on the layer), so one compiled step serves both Stage-B arms."""
  model, opt = LPCSM(TINY), optax.adam(lr)

  def step(params, opt_state, ratio_update):
    grads = jax.grad(lambda p: lpcsm_loss(model.apply, p, _batch())[0])(params)
    updates, opt_state = opt.update(grads, opt_state)
    controller = updates["layers"]["controller"]
    updates["layers"]["controller"] = {**controller, "ratio_logit": controller["ratio_logit"] * ratio_update}
    return optax.apply_updates(params, updates), opt_state

  return jax.jit(step), opt


def _stream_spread(streams):
  """The streams' spread around their mean, relative to their scale."""
  return float(jnp.std(streams, axis=-2).mean() / jnp.std(streams))


def _rate_tolerance(ratio, n=4 * 96 * 2):
  return 4 * np.sqrt(ratio * (1 - ratio) / n) + 0.02  # sampling, and the skew of a log-χ² score


def _with_ratio(params, ratio, cfg=TINY):
  logit = bounded_init(ratio, cfg.ratio_min, cfg.ratio_max)
  controller = {**params["layers"]["controller"],
                "ratio_logit": jnp.full_like(params["layers"]["controller"]["ratio_logit"], logit)}
  return {**params, "layers": {**params["layers"], "controller": controller}}


def test_init_keeps_the_plain_model_and_every_part_gets_a_gradient():
  """At init the model equals the one without predictive correction (W_c = 0) and, through
  the readout, the one without mHC (the spread init keeps the plain residual stream), while
  its streams differ; W_c, mHC's pre-mix, transport and α get LM gradients in every layer."""
  params = _model()[1]["params"]
  logits, extras, streams = _probe_forward()(params)
  layers = params["layers"]
  no_pc = {**params, "layers": {k: v for k, v in layers.items() if k not in ("predictor", "controller", "correction")}}
  no_mhc = {**no_pc, "layers": {k: v for k, v in no_pc["layers"].items() if k != "mhc"}}
  without_pc = LPCSM(dataclasses.replace(TINY, predictive_coding=False)).apply({"params": no_pc}, PROBE)
  np.testing.assert_allclose(without_pc, logits, atol=1e-6, rtol=1e-6)
  plain = LPCSM(dataclasses.replace(TINY, predictive_coding=False, mhc=False)).apply({"params": no_mhc}, PROBE)
  np.testing.assert_allclose(plain, logits, atol=2e-5, rtol=2e-5)
  assert _stream_spread(streams) > 0.05
  assert abs(float(extras["fire_rate"]) - TINY.ratio_init) < _rate_tolerance(TINY.ratio_init)

  grads = _lm_grads()(params)["layers"]
  assert np.abs(grads["correction"]["kernel"]).max() > 0
  for name in ("pre_logits", "res_logits", "dynamic_alpha"):
    per_layer = np.abs(np.asarray(grads["mhc"][name])).reshape(TINY.num_layers, -1).max(axis=1)
    assert per_layer.min() > 1e-7, (name, per_layer)


@pytest.mark.parametrize("ratio", [0.1, 0.4])
def test_fire_rate_starts_at_rho_and_the_lm_loss_reaches_rho(ratio):
  """The initial firing rate is ρ within sampling error, and with the auxiliary weights at 0
  the LM loss alone gives ρ a gradient in every layer (once W_c is off zero)."""
  params = _with_ratio(_model()[1]["params"], ratio)
  assert abs(float(_probe_forward()(params)[1]["fire_rate"]) - ratio) < _rate_tolerance(ratio)
  perturbed = _with_ratio(_perturb({"params": params}, scale=0.05)["params"], ratio)
  assert np.abs(np.asarray(_lm_grads()(perturbed)["layers"]["controller"]["ratio_logit"])).min() > 0


def test_a_short_run_moves_mhc_and_rho_and_the_fixed_arm_keeps_its_rate():
  """From the init: after a few Adam steps every mHC parameter (φ too) and the transport have
  moved, the streams are still apart, ρ has moved inside its bounds; the fixed-ratio arm
  (Stage B's control) trains the rest while its firing rate stays at ρ."""
  params0 = _model()[1]["params"]
  step, opt = _train_step()
  runs = {}
  for arm, ratio_update in (("adaptive", 1.0), ("fixed", 0.0)):
    params, opt_state, rates = params0, opt.init(params0), []
    for _ in range(6):
      params, opt_state = step(params, opt_state, ratio_update)
      _, extras, streams = _probe_forward()(params)
      rates.append(float(extras["fire_rate"]))
    runs[arm] = params, rates, streams

  params, rates, streams = runs["adaptive"]
  before, after = params0["layers"]["mhc"], params["layers"]["mhc"]
  for name in ("pre_logits", "post_logits", "res_logits", "dynamic_alpha", "dynamic_proj"):
    assert np.abs(np.asarray(after[name]) - np.asarray(before[name])).max() > 1e-3, name
  transport = lambda mhc: jax.vmap(sinkhorn)(mhc["res_logits"])
  assert np.abs(transport(after) - transport(before)).max() > 1e-4
  # The memory's reads start at zero, so its pooling query and decay shifts get no gradient at
  # step 0 (zero times zero); once the reads move, they must too.
  memory0, memory = params0["layers"]["memory"], params["layers"]["memory"]
  for name in ("pool_query", "fast_decay_shift", "slow_decay_shift", "read_fast", "read_slow"):
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(), memory[name], memory0[name])
    assert max(jax.tree.leaves(moved)) > 1e-4, name
  assert _stream_spread(streams) > 0.05
  ratio = bounded(params["layers"]["controller"]["ratio_logit"], TINY.ratio_min, TINY.ratio_max)
  assert np.abs(np.asarray(ratio) - TINY.ratio_init).max() > 1e-2 and np.all((0.05 <= ratio) & (ratio <= 0.5))

  params, rates, _ = runs["fixed"]
  np.testing.assert_array_equal(params["layers"]["controller"]["ratio_logit"],
                                params0["layers"]["controller"]["ratio_logit"])
  assert np.abs(params["layers"]["controller"]["score_weight"] - 1.0).max() > 1e-3
  # The score's weights (and the memory reads the predictor sees) train, so the score's
  # distribution, and the rate at the fixed threshold, wobble from step to step around ρ.
  tolerance = _rate_tolerance(TINY.ratio_init)
  assert abs(np.mean(rates) - TINY.ratio_init) < tolerance, rates
  assert all(abs(r - TINY.ratio_init) < 1.5 * tolerance for r in rates), rates


def test_lr_scales_multiply_the_matching_updates_only():
  from lpcjax.config import TrainConfig
  from lpcjax.models.lpcsm import LPCSMTrainConfig
  from lpcjax.training.steps import make_optimizer
  params = {"controller": {"ratio_logit": jnp.float32(0.0)}, "other": {"ratio": jnp.float32(0.0)}}
  grads = jax.tree.map(lambda _: jnp.float32(0.5), params)
  plain = make_optimizer(TrainConfig(steps=10, warmup_steps=0))
  scaled = make_optimizer(LPCSMTrainConfig(steps=10, warmup_steps=0, lr_scales=("ratio_logit=10",)))
  assert len(plain.init(params)) == 2  # no rules: the optimizer state keeps its old structure
  updates = scaled.update(grads, scaled.init(params), params)[0]
  np.testing.assert_allclose(updates["controller"]["ratio_logit"], 10 * updates["other"]["ratio"], rtol=1e-6)
  unscaled = plain.update(grads, plain.init(params), params)[0]
  np.testing.assert_allclose(updates["other"]["ratio"], unscaled["other"]["ratio"])
  with pytest.raises(ConfigError, match="lr_scales"):
    LPCSMTrainConfig(lr_scales=("ratio_logit",))


def test_saved_configs_with_the_old_temperature_still_load():
  from lpcjax import experiment as C
  values = C.to_dict(C.load_experiment("configs/lpcsm.py:tiny"))
  values["model"]["controller_temperature"] = 1.0
  assert C.from_dict(values).model == C.load_experiment("configs/lpcsm.py:tiny").model
  values["model"]["controller_temperature"] = 2.0
  with pytest.raises(ConfigError, match="controller_temperature"):
    C.from_dict(values)


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
  assert a.train.lr_scales == b.train.lr_scales == ("ratio_logit=10",)
  assert (a.train.steps, b.train.steps, c.train.steps) == (300, 150, 150)  # the docstring's table
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
