import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpcjax.layers import (MHC, ONT, AttentionConfig, ControllerConfig, DualTimescaleMemory, ForgettingAttention,
                           GateConfig, MemoryConfig, MHCConfig, ONTConfig, SparseController, causal_standardize,
                           collapse_streams, expand_streams, init_window_cache, linear_recurrence, ont_write,
                           running_standardize, sinkhorn)


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape)


def _push(params, loss_fn, sign, steps=60, lr=1.0):
  """Adam steps that minimise sign · loss_fn(params) hard."""
  opt = optax.adam(lr)
  state = opt.init(params)
  grad_fn = jax.jit(jax.grad(lambda p: sign * loss_fn(p)))
  for _ in range(steps):
    updates, state = opt.update(grad_fn(params), state)
    params = optax.apply_updates(params, updates)
  return params


# ----------------------------------------------------------------------------- Sinkhorn / mHC


@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_sinkhorn_is_doubly_stochastic(scale):
  p = sinkhorn(scale * _normal(0, (3, 5, 5)), iterations=50)
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(p.sum(-2), 1.0, atol=1e-5)
  assert (p >= 0).all()


class _Block(nn.Module):
  """A sub-layer F = tanh(Dense(h)) wrapped by MHC."""

  config: MHCConfig

  @nn.compact
  def __call__(self, x):
    dense = nn.Dense(x.shape[-1], name="f")
    return MHC(self.config, name="mhc")(x, lambda h: jnp.tanh(dense(h))), dense


def test_mhc_one_stream_is_a_plain_residual_block():
  x = _normal(0, (2, 7, 1, 8))
  block = _Block(MHCConfig(num_streams=1, d_model=8))
  params = block.init(jax.random.PRNGKey(1), x)
  out = block.apply(params, x)[0]
  f = nn.Dense(8)
  expected = x[:, :, 0] + jnp.tanh(f.apply({"params": params["params"]["f"]}, x[:, :, 0]))
  np.testing.assert_array_equal(out[:, :, 0], expected)
  np.testing.assert_array_equal(collapse_streams(out), out[:, :, 0])


def test_mhc_identity_init_with_copied_streams_is_a_residual_block():
  x = _normal(0, (2, 7, 8))
  block = _Block(MHCConfig(num_streams=4, d_model=8))
  params = block.init(jax.random.PRNGKey(1), expand_streams(x, 4))
  out = block.apply(params, expand_streams(x, 4))[0]
  expected = x + jnp.tanh(nn.Dense(8).apply({"params": params["params"]["f"]}, x))
  np.testing.assert_allclose(collapse_streams(out), expected, atol=1e-5)


def test_mhc_streams_shapes_and_gradients():
  n = 3
  x = _normal(0, (2, 5, n, 8))  # distinct streams
  block = _Block(MHCConfig(num_streams=n, d_model=8))
  params = block.init(jax.random.PRNGKey(1), x)
  out = block.apply(params, x)[0]
  assert out.shape == x.shape
  weights = _normal(2, x.shape)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(block.apply(p, x)[0] * weights)))(params)["params"]["mhc"]
  # (φ's gradient is α · ... = 0 at α = 0; α's is not, and φ follows once α moves)
  for name in ("pre_logits", "post_logits", "res_logits", "dynamic_alpha"):
    g = nn.meta.unbox(grads[name])
    assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, name
  with pytest.raises(ValueError):
    block.apply(params, _normal(0, (2, 5, n + 1, 8)))
  static = _Block(MHCConfig(num_streams=n, dynamic=False))
  assert set(static.init(jax.random.PRNGKey(1), x)["params"]["mhc"]) == {"pre_logits", "post_logits", "res_logits"}


class _Stack(nn.Module):
  """Two sub-layers F_k = tanh(Dense_k(h)), each wrapped by its own MHC; None: plain residual."""

  config: MHCConfig | None

  @nn.compact
  def __call__(self, x):
    for k in range(2):
      dense = nn.Dense(x.shape[-1], name=f"f{k}")
      fn = lambda h, dense=dense: jnp.tanh(dense(h))
      x = MHC(self.config, name=f"mhc{k}")(x, fn) if self.config else x + fn(x)
    return x


def test_mhc_spread_init_keeps_the_mean_stream_and_breaks_the_symmetry():
  """The spread stream/pre/post/readout init: the readout is exactly the plain residual stack,
  the streams differ, and every block's pre-mix and transport get gradients at init; with the
  symmetric init (issue #21) the streams stay copies and the transport gradients vanish."""
  x = _normal(0, (2, 5, 8))
  plain = _Stack(None)
  plain_params = plain.init(jax.random.PRNGKey(1), x)["params"]
  weights = _normal(2, x.shape)
  apply = _Stack(MHCConfig(num_streams=4, d_model=8))  # the spreads only set the init: one jit
  run = jax.jit(lambda p, xs, readout: jnp.einsum("n,...nd->...d", readout, apply.apply(p, xs)))
  grad = jax.jit(jax.grad(lambda p, xs, readout: jnp.sum(run(p, xs, readout) * weights)))
  for spread in (0.5, 0.0):
    cfg = MHCConfig(num_streams=4, d_model=8, pre_spread=spread, post_spread=spread)
    xs = expand_streams(x, 4, spread)
    readout = collapse_streams(jnp.eye(4)[None], spread)[0]  # the readout's weights [n]
    params = nn.meta.unbox(_Stack(cfg).init(jax.random.PRNGKey(1), xs))
    params["params"].update({k: plain_params[k] for k in ("f0", "f1")})
    np.testing.assert_allclose(run(params, xs, readout), plain.apply({"params": plain_params}, x), atol=1e-5)
    grads = grad(params, xs, readout)["params"]
    differ = float(jnp.std(apply.apply(params, xs), axis=-2).max())
    transport = min(float(np.abs(grads[f"mhc{k}"]["res_logits"]).max()) for k in range(2))
    pre = min(float(np.abs(grads[f"mhc{k}"]["pre_logits"]).min()) for k in range(2))
    if spread:
      assert differ > 1e-2 and transport > 1e-4 and pre > 1e-4, (differ, transport, pre)
    else:
      assert differ < 1e-6 and transport < 1e-6, (differ, transport)


# ----------------------------------------------------------------------------- ONT


def test_ont_write_keeps_parallel_and_scales_orthogonal():
  w, s = _normal(0, (4, 16)), _normal(1, (4, 16))
  kappa = 2.5
  out = ont_write(w, s, kappa)
  unit = s / jnp.linalg.norm(s, axis=-1, keepdims=True)

  def split(v):
    par = jnp.sum(v * unit, -1, keepdims=True) * unit
    return par, v - par

  (wp, wo), (op, oo) = split(w), split(out)
  np.testing.assert_allclose(op, wp, atol=1e-5)
  np.testing.assert_allclose(oo, kappa * wo, atol=1e-5)
  np.testing.assert_allclose(ont_write(w, jnp.zeros_like(s), kappa), kappa * w, atol=1e-6)  # empty state: all novel


def test_ont_module_disabled_is_plain_write_and_kappa_stays_bounded():
  w, s = _normal(0, (4, 16)), _normal(1, (4, 16))
  plain = ONT(ONTConfig(enabled=False))
  assert plain.init(jax.random.PRNGKey(0), w, s) == {}
  np.testing.assert_array_equal(plain.apply({}, w, s), w)

  cfg = ONTConfig(kappa_max=4.0, kappa_init=2.0)
  ont = ONT(cfg)
  params = nn.meta.unbox(ont.init(jax.random.PRNGKey(0), w, s))

  def kappa(p):
    return 1.0 + (cfg.kappa_max - 1.0) * jax.nn.sigmoid(p["params"]["kappa_logit"])

  np.testing.assert_allclose(kappa(params), 2.0, rtol=1e-6)

  def size(p):  # norm of the amplified write grows with κ
    return jnp.sum(ont.apply(p, w, s) ** 2)

  for sign in (1.0, -1.0):  # push κ down, then up, far past the bounds
    pushed = _push(params, size, sign)
    k = float(kappa(pushed))
    assert 1.0 <= k <= cfg.kappa_max
    assert (k < 1.1) if sign > 0 else (k > 3.9)  # sign > 0 minimises


# ----------------------------------------------------------------------------- memory

MEM = MemoryConfig(d_model=8, memory_dim=6, chunk_size=4, read_init_std=0.3)


def _memory(cfg=MEM, seq=16, seed=0):
  x = _normal(seed, (2, seq, cfg.d_model))
  layer = DualTimescaleMemory(cfg)
  return layer, nn.meta.unbox(layer.init(jax.random.PRNGKey(1), x)), x


def test_memory_starts_at_zero_reads():
  layer, params, x = _memory(MemoryConfig(d_model=8, memory_dim=6, chunk_size=4))
  reads, state = layer.apply(params, x)
  assert reads.shape == x.shape and state["fast"].shape == (2, 6) and state["slow"].shape == (2, 6)
  np.testing.assert_array_equal(reads, 0.0)


@pytest.mark.parametrize("slow,ont", [(True, True), (True, False), (False, False)])
def test_memory_is_causal_per_chunk(slow, ont):
  cfg = MemoryConfig(d_model=8, memory_dim=6, chunk_size=4, read_init_std=0.3, slow=slow, ont=ont)
  layer, params, x = _memory(cfg)
  base = layer.apply(params, x)[0]
  for t in (0, 5, 11):
    end = (t // cfg.chunk_size + 1) * cfg.chunk_size  # positions < end are in chunks ≤ t's chunk
    changed = layer.apply(params, x.at[:, t].add(3.0))[0]
    np.testing.assert_array_equal(changed[:, :end], base[:, :end])
    assert np.abs(changed[:, end:] - base[:, end:]).min() > 0  # and every later read sees it


@pytest.mark.parametrize("slow,ont", [(True, True), (False, False)])
def test_memory_streaming_matches_one_pass(slow, ont):
  cfg = MemoryConfig(d_model=8, memory_dim=6, chunk_size=4, read_init_std=0.3, slow=slow, ont=ont)
  layer, params, x = _memory(cfg, seq=24)
  full, full_state = layer.apply(params, x)
  state, pieces = None, []
  for start, stop in ((0, 4), (4, 12), (12, 16), (16, 24)):
    reads, state = layer.apply(params, x[:, start:stop], state)
    pieces.append(reads)
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)
  for key in full_state:
    np.testing.assert_allclose(state[key], full_state[key], atol=1e-5)


def _perturbed_memory(cfg, seq):
  """The layer with its pooling query and decay shifts off their zero init."""
  layer, params, x = _memory(cfg, seq=seq)
  p = dict(params["params"])
  if cfg.summary_pool == "attention":
    p["pool_query"] = 0.5 * _normal(5, p["pool_query"].shape)
  for name in ("fast_decay_shift", "slow_decay_shift"):
    if name in p:
      p[name] = {"kernel": 2.0 * _normal(6, p[name]["kernel"].shape)}
  return layer, {"params": p}, x


@pytest.mark.parametrize("pool,selective", [("mean", False), ("attention", True)])
def test_memory_states_match_a_naive_loop(pool, selective):
  cfg = dataclasses.replace(MEM, summary_pool=pool, selective_decay=selective)
  layer, params, x = _perturbed_memory(cfg, seq=20)
  _, state = layer.apply(params, x)
  p = params["params"]
  chunks = x.reshape(2, 5, 4, 8)
  if pool == "mean":
    pooled = chunks.mean(2)
  else:  # softmax over each chunk's tokens of q · x_t, written out
    scores = jnp.exp(jnp.sum(chunks * p["pool_query"], -1))
    pooled = jnp.sum(chunks * (scores / scores.sum(-1, keepdims=True))[..., None], 2)
  c = pooled @ p["summary"]["kernel"]
  kappa = 1.0 + 3.0 * jax.nn.sigmoid(p["ont"]["kappa_logit"])
  fast = slow = jnp.zeros((2, 6))
  for k in range(5):
    shift = lambda name: c[:, k] @ p[name]["kernel"] if selective else 0.0
    a = jax.nn.sigmoid(p["fast_decay_logit"] + shift("fast_decay_shift"))
    lam = jax.nn.sigmoid(p["slow_decay_logit"] + shift("slow_decay_shift"))
    fast = a * fast + (1 - a) * c[:, k]
    if k == 0:  # zero state: the whole summary is novel
      par = jnp.zeros_like(slow)
    else:
      unit = slow / jnp.linalg.norm(slow, axis=-1, keepdims=True)
      par = jnp.sum(c[:, k] * unit, -1, keepdims=True) * unit
    slow = lam * slow + (1 - lam) * (par + kappa * (c[:, k] - par))
  np.testing.assert_allclose(state["fast"], fast, atol=1e-5)
  np.testing.assert_allclose(state["slow"], slow, atol=1e-5)


def test_memory_pooling_and_decay_shifts_start_neutral_and_get_gradients():
  """At init the attention-pooled, selective memory is the mean-pooled one with fixed decays
  (q = 0, U = 0), and q and both shifts get gradients from the reads at once."""
  cfg = dataclasses.replace(MEM, read_init_std=0.3)
  layer, params, x = _memory(cfg, seq=20)
  plain = DualTimescaleMemory(dataclasses.replace(cfg, summary_pool="mean", selective_decay=False))
  p = params["params"]
  kept = {k: v for k, v in p.items() if k not in ("pool_query", "fast_decay_shift", "slow_decay_shift")}
  np.testing.assert_allclose(layer.apply(params, x)[0], plain.apply({"params": kept}, x)[0], atol=1e-6)
  grads = jax.grad(lambda p: jnp.sum(jnp.sin(layer.apply({"params": p}, x)[0])))(p)
  for name in ("pool_query", "fast_decay_shift", "slow_decay_shift"):
    assert np.abs(np.asarray(jax.tree.leaves(grads[name])[0])).max() > 1e-6, name


def test_linear_recurrence_matches_a_loop():
  decay = jax.nn.sigmoid(_normal(0, (3, 9, 5)))
  inputs, initial = _normal(1, (3, 9, 5)), _normal(2, (3, 5))
  out = linear_recurrence(decay, inputs, initial)
  s, expected = initial, []
  for k in range(9):
    s = decay[:, k] * s + inputs[:, k]
    expected.append(s)
  np.testing.assert_allclose(out, jnp.stack(expected, 1), atol=1e-5)


def test_memory_rejects_unaligned_length():
  layer, params, x = _memory()
  with pytest.raises(ValueError, match="multiple of chunk_size"):
    layer.apply(params, x[:, :6])


# ----------------------------------------------------------------------------- controller


def test_causal_standardize_ignores_the_future():
  r = _normal(0, (2, 12))
  z = causal_standardize(r)
  np.testing.assert_allclose(z[:, :7], causal_standardize(r[:, :7]), atol=1e-6)
  assert np.all(z[:, 0] == 0)


def _controller(cfg=ControllerConfig(), d=8):
  e = _normal(0, (4, 64, d)) * jnp.exp(_normal(1, (4, 64, 1)))
  ctrl = SparseController(cfg)
  return ctrl, nn.meta.unbox(ctrl.init(jax.random.PRNGKey(0), e)), e


def test_controller_mask_is_binary_and_gradients_reach_its_parameters():
  ctrl, params, e = _controller()
  mask, p, ratio, aux, _ = ctrl.apply(params, e)
  assert mask.shape == p.shape == (4, 64)
  assert set(np.unique(np.asarray(mask))) <= {0.0, 1.0}
  np.testing.assert_array_equal(mask, (p > 0.5).astype(mask.dtype))
  np.testing.assert_allclose(ratio, 0.2, rtol=1e-6)
  assert 0.05 < float(jnp.mean(mask)) < 0.5 and np.isfinite(aux)
  weights = _normal(3, mask.shape)
  grads = jax.jit(jax.grad(lambda q: jnp.sum(ctrl.apply(q, e)[0] * weights)))(params)["params"]
  assert set(grads) == {"score_weight", "ratio_logit"}
  for name in grads:
    assert np.abs(grads[name]).max() > 0, name
  affine, affine_params, _ = _controller(ControllerConfig(score="affine"))
  grads = jax.grad(lambda q: jnp.sum(affine.apply(q, e)[0] * weights))(affine_params)["params"]
  for name in ("scale", "bias", "ratio_logit"):
    assert np.abs(grads[name]) > 0, name


@pytest.mark.parametrize("ratio", [0.1, 0.2, 0.4])
def test_controller_fires_at_rate_rho_whatever_the_scores_scale(ratio):
  """The standardised score fires a fraction ρ of tokens at init, and rescaling or shifting
  the error statistic (its scale and offset) cannot change the rate: only ρ sets it."""
  ctrl, params, _ = _controller(ControllerConfig(ratio_init=ratio), d=32)
  e = _normal(0, (4, 256, 32))
  n = e.shape[0] * e.shape[1]
  tolerance = 4 * np.sqrt(ratio * (1 - ratio) / n) + 0.02  # sampling + the log-χ² skew at d = 32
  rate = float(jnp.mean(ctrl.apply(params, e)[0]))
  assert abs(rate - ratio) < tolerance, rate
  mask = ctrl.apply(params, e)[0]
  scaled = {"params": {**params["params"], "score_weight": 7.0 * params["params"]["score_weight"]}}
  # errors 30x larger (an offset of the log-score) or a 7x larger score weight: the same mask
  # up to float32 rounding at the threshold
  for variables, factor in ((params, 30.0), (scaled, 1.0)):
    assert float(jnp.mean(ctrl.apply(variables, factor * e)[0] == mask)) > 0.99

def test_controller_ratio_stays_in_bounds():
  cfg = ControllerConfig(ratio_min=0.05, ratio_max=0.5)
  ctrl, params, e = _controller(cfg)
  for sign in (-1.0, 1.0):
    pushed = _push(params, lambda q: ctrl.apply(q, e)[2], sign)
    ratio = float(ctrl.apply(pushed, e)[2])
    assert cfg.ratio_min <= ratio <= cfg.ratio_max
    assert (ratio < 0.06) if sign > 0 else (ratio > 0.49)


def test_fixed_ratio_gets_no_gradient():
  ctrl, params, e = _controller(ControllerConfig(learn_ratio=False))
  weights = _normal(3, (4, 64))

  def loss(q):
    mask, _, ratio, aux, _ = ctrl.apply(q, e)
    return jnp.sum(mask * weights) + ratio + aux

  grads = jax.grad(loss)(params)["params"]
  assert grads["ratio_logit"] == 0 and np.abs(grads["score_weight"]).max() > 0


def test_running_standardize_chunk_by_chunk_equals_one_pass():
  r = 3.0 + _normal(0, (2, 20))
  full = causal_standardize(r)
  stats, pieces = None, []
  for start, stop in ((0, 1), (1, 8), (8, 20)):
    z, stats = running_standardize(r[:, start:stop], stats)
    pieces.append(z)
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("gate", ["none", "data_dependent"])
def test_local_attention_streaming_equals_the_windowed_kernel(gate):
  cfg = AttentionConfig(d_model=8, num_heads=2, head_dim=4, window=5, impl="reference",
                        gate=GateConfig(num_heads=2) if gate == "data_dependent" else None)
  layer, x = ForgettingAttention(cfg), _normal(0, (2, 17, 8))
  params = layer.init(jax.random.PRNGKey(1), x)
  full = layer.apply(params, x)
  # the window reaches 4 tokens back: a token's output depends on nothing older
  moved = layer.apply(params, x.at[:, 3].add(1.0))
  np.testing.assert_allclose(moved[:, 8:], full[:, 8:], atol=1e-7)  # (the gate: c_i − c_j rounding)
  assert np.abs(moved[:, 3:8] - full[:, 3:8]).min() > 0
  cache, pieces, position = init_window_cache(cfg, 2), [], 0
  for start, stop in ((0, 2), (2, 3), (3, 12), (12, 17)):  # chunks shorter and longer than the window
    out, cache = layer.apply(params, x[:, start:stop], cache=cache, context={"position": position})
    pieces.append(out)
    position = stop
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)
