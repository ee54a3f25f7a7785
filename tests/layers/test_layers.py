
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.layers import (AttentionConfig, ForgetGate, ForgettingAttention, GateConfig, KVShift, MLPConfig,
                           RMSNorm, SwiGLU, apply_rope, geometric_timescales, segment_positions,
                           swiglu_hidden_size, timescale_bias)
from lpcjax.models import FoXConfig, TransformerConfig


def tiny(**kw):
  return FoXConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=4, mlp_multiple_of=16, **kw)


def test_rmsnorm_matches_direct_formula():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 16))
  norm = RMSNorm(eps=1e-6)
  params = norm.init(jax.random.PRNGKey(1), x)
  params = jax.tree.map(lambda p: p * 1.5, params)
  expected = np.asarray(x) / np.sqrt(np.mean(np.asarray(x) ** 2, -1, keepdims=True) + 1e-6) * 1.5
  np.testing.assert_allclose(norm.apply(params, x), expected, rtol=1e-5, atol=1e-6)


def test_swiglu_hidden_size_follows_fox_recipe():
  assert swiglu_hidden_size(768, 4.0) == 2048  # 768 * 4 * 2/3 = 2048 exactly
  assert swiglu_hidden_size(1536, 3.5) == 3584  # Pro ratio
  assert swiglu_hidden_size(1000, 4.0) == 2816  # 2666.7 rounded up to a multiple of 256
  # The official code truncates before rounding up: 110 * 3.5 * 2/3 = 256.67 -> 256, not 512.
  assert swiglu_hidden_size(110, 3.5) == 256


def test_rope_depends_only_on_relative_position():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(1, 1, 1, 32)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 1, 1, 32)), jnp.float32)
  score = lambda i, j: float(jnp.sum(apply_rope(q, jnp.array([[i]]), 500.0) *
                                     apply_rope(k, jnp.array([[j]]), 500.0)))
  assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4)
  assert score(7, 3) != pytest.approx(score(8, 3), rel=1e-3)
  np.testing.assert_allclose(apply_rope(q, jnp.array([[0]])), q)  # position 0 is the identity


def test_segment_positions_restart_at_each_segment():
  seg = jnp.array([[0, 0, 0, 1, 1, 2]])
  np.testing.assert_array_equal(segment_positions(seg, 6), [[0, 1, 2, 0, 1, 0]])


def test_timescale_init_gives_geometric_one_over_e_decay():
  timescales = geometric_timescales(4, 2.0, 128.0)
  np.testing.assert_allclose(timescales, [2, 8, 32, 128])
  f = 1 / (1 + np.exp(-timescale_bias(timescales)))
  np.testing.assert_allclose(f ** timescales, np.exp(-1), rtol=1e-12)


def test_fixed_gate_is_alibi_slope_and_has_no_params():
  gate = ForgetGate(GateConfig(num_heads=4, variant="fixed", t_min=2.0, t_max=128.0))
  x = jnp.ones((1, 3, 16))
  variables = gate.init(jax.random.PRNGKey(0), x)
  assert not jax.tree.leaves(variables)
  np.testing.assert_allclose(gate.apply(variables, x)[0, 0], -1 / np.array([2, 8, 32, 128]), rtol=1e-5)


def test_data_independent_gate_is_learned_and_data_dependent_starts_at_half():
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 16))
  gate = ForgetGate(GateConfig(num_heads=4, variant="data_independent"))
  variables = gate.init(jax.random.PRNGKey(0), x)
  assert jax.tree.leaves(variables)[0].shape == (4,)
  dependent = ForgetGate(GateConfig(num_heads=4))
  variables = dependent.init(jax.random.PRNGKey(0), x)
  variables = jax.tree.map(jnp.zeros_like, variables)  # bias 0 at init: f = 0.5 without input
  np.testing.assert_allclose(dependent.apply(variables, x), np.log(0.5), rtol=1e-6)


def test_kv_shift_matches_formula_and_resets_at_segments():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(1, 5, 16)), jnp.float32)
  cand = jnp.asarray(rng.normal(size=(1, 5, 4, 4)), jnp.float32)
  shift = KVShift(num_heads=4)
  params = shift.init(jax.random.PRNGKey(0), x, cand)
  w = np.asarray(jax.tree.leaves(params)[0])  # [d_model, heads]
  alpha = 1 / (1 + np.exp(-(np.asarray(x) @ w)))[..., None]
  prev = np.concatenate([np.zeros_like(cand[:, :1]), cand[:, :-1]], axis=1)
  np.testing.assert_allclose(shift.apply(params, x, cand), alpha * prev + (1 - alpha) * cand, atol=1e-6)
  seg = jnp.array([[0, 0, 1, 1, 1]])
  out = shift.apply(params, x, cand, seg)
  np.testing.assert_allclose(out[:, 2], (1 - alpha[:, 2]) * cand[:, 2], atol=1e-6)


def test_data_dependent_gate_can_start_from_timescale_bias():
  x = jnp.zeros((1, 3, 16))
  gate = ForgetGate(tiny(gate_bias_init="timescale", gate_t_min=2.0, gate_t_max=128.0).gate_config())
  log_f = gate.apply(gate.init(jax.random.PRNGKey(0), x), x)  # x = 0: only the bias acts
  np.testing.assert_allclose(log_f[0, 0], -1 / np.array([2, 8, 32, 128]), rtol=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_pro_output_norm_is_per_channel_of_every_head_with_norm_eps(shared):
  """As in the official model: only the QK-norm scale follows qk_norm_shared_scale; the output
  norm has heads x head_dim weights and the config's norm_eps."""
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 6, 16))
  layer = lambda **kw: ForgettingAttention(tiny(block="pro", attention_impl="reference",
                                                qk_norm_shared_scale=shared, **kw).attention_config())
  params = layer().init(jax.random.PRNGKey(1), x)["params"]
  unbox = lambda p: np.asarray(getattr(p, "value", p))
  assert unbox(params["q_norm"]["scale"]).shape == ((4,) if shared else (4, 4))
  assert unbox(params["o_norm"]["scale"]).shape == (4, 4)
  # A huge eps shrinks the normalized output towards 0 (and the layer's output with it).
  base, damped = layer().apply({"params": params}, x), layer(norm_eps=1e4).apply({"params": params}, x)
  assert float(jnp.max(jnp.abs(damped))) < 0.1 * float(jnp.max(jnp.abs(base)))


def test_family_configs_build_the_layer_configs():
  fox = tiny(block="pro", gate_t_max=64.0, attention_window=8, prune_epsilon=1e-4, debug_checks=True)
  attention = fox.attention_config()
  assert attention == AttentionConfig(
      d_model=16, num_heads=4, head_dim=4, use_rope=False, use_qk_norm=True, use_output_norm=True,
      use_output_gate=True, use_kv_shift=True, window=8, prune_epsilon=1e-4, debug=True,
      gate=GateConfig(num_heads=4, t_max=64.0))
  assert fox.mlp_config() == MLPConfig(d_model=16, hidden=48)
  plain = TransformerConfig(d_model=16, num_heads=4, qk_norm=True, rope_theta=500000.0).attention_config()
  assert plain.gate is None and plain.use_qk_norm and not plain.use_kv_shift and plain.rope_theta == 500000.0
  assert plain.prune_epsilon is None


def test_layer_configs_reject_impossible_combinations():
  with pytest.raises(ValueError, match="gate.num_heads"):
    AttentionConfig(d_model=16, num_heads=4, head_dim=4, gate=GateConfig(num_heads=2))
  with pytest.raises(ValueError, match="even head_dim"):
    AttentionConfig(d_model=15, num_heads=5, head_dim=3)
  with pytest.raises(ValueError, match="variant"):
    GateConfig(num_heads=4, variant="none")
  with pytest.raises(ValueError, match="t_min"):
    GateConfig(num_heads=4, t_min=8.0, t_max=2.0)


def test_layers_live_in_another_model_with_a_few_fields():
  """The README's example: FoX attention + SwiGLU in a user's own Linen block."""
  import flax.linen as nn

  class MyBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
      attention = AttentionConfig(d_model=16, num_heads=4, head_dim=4, use_rope=False,
                                  gate=GateConfig(num_heads=4), impl="reference")
      x = x + ForgettingAttention(attention, name="attn")(nn.RMSNorm()(x))
      return x + SwiGLU(MLPConfig(d_model=16, hidden=32), name="mlp")(nn.RMSNorm()(x))

  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 16))
  variables = MyBlock().init(jax.random.PRNGKey(1), x)
  params = nn.unbox(variables["params"])
  assert params["attn"]["forget_gate"]["proj"]["kernel"].shape == (16, 4)
  assert params["mlp"]["w_up"]["kernel"].shape == (16, 32)
  out = MyBlock().apply(variables, x)
  assert out.shape == x.shape
  moved = MyBlock().apply(variables, x.at[:, 4].add(1.0))  # causal
  np.testing.assert_allclose(moved[:, :4], out[:, :4], atol=1e-6)


def test_decoding_caches_keep_long_context_decay_exact():
  """Both caches at |c| ~ 5e4 (log f in [-4, -1], c offset by 5e4 at position 0): decoding
  steps after a prefilled prompt and a windowed stream in chunks equal float64 within 1e-4,
  because the caches keep c in two float32 parts (a float32 c put ~1e-3 into every weight)."""
  from float64_attention import forgetting_attention_float64, long_context_inputs
  from lpcjax.layers.attention import (cached_attention, init_layer_cache, init_window_cache, prefilled_cache,
                                       window_chunk_attention)
  seq_len, prompt, window, chunk = 512, 508, 64, 128
  q, k, v, log_f, do = long_context_inputs(3, 1, seq_len, 2, 16, c_offset=5e4)
  relative = lambda got, want: float(np.max(np.abs(np.float64(got) - want)) / np.max(np.abs(want)))

  cfg = AttentionConfig(d_model=32, num_heads=2, head_dim=16, gate=GateConfig(num_heads=2))
  cache = prefilled_cache(init_layer_cache(cfg, 1, seq_len), k[:, :prompt], v[:, :prompt], log_f[:, :prompt],
                          None)
  step = jax.jit(lambda *args: cached_attention(*args))
  want = forgetting_attention_float64(q, k, v, log_f, do)[0]
  segments = jnp.zeros((1, seq_len), jnp.int32)
  for position in range(prompt, seq_len):
    at = slice(position, position + 1)
    context = {"lengths": jnp.array([position]), "segments": segments}
    o, cache = step(q[:, at], k[:, at], v[:, at], log_f[:, at], cache, context)
    assert relative(o, want[:, at]) <= 1e-4, position

  want = forgetting_attention_float64(q, k, v, log_f, do, window=window)[0]
  stream, pieces = init_window_cache(AttentionConfig(d_model=32, num_heads=2, head_dim=16, window=window), 1), []
  chunk_step = jax.jit(window_chunk_attention)
  for start in range(0, seq_len, chunk):
    at = slice(start, start + chunk)
    o, stream = chunk_step(q[:, at], k[:, at], v[:, at], log_f[:, at], stream)
    pieces.append(o)
  assert relative(jnp.concatenate(pieces, axis=1), want) <= 1e-4


def test_attention_prefill_then_decode_equals_the_parallel_pass():
  """The layer's paths share one projection and output step: a prefilled prompt and then one
  token at a time give the parallel pass's outputs (every Pro part, grouped-query heads)."""
  import dataclasses

  from lpcjax.layers.attention import init_layer_cache, init_window_cache
  cfg = AttentionConfig(d_model=16, num_heads=4, head_dim=4, num_kv_heads=2, gate=GateConfig(num_heads=4),
                        use_qk_norm=True, use_output_norm=True, use_output_gate=True, use_kv_shift=True,
                        impl="reference")
  layer, x = ForgettingAttention(cfg), jax.random.normal(jax.random.PRNGKey(0), (2, 9, 16))
  params = layer.init(jax.random.PRNGKey(1), x)
  full, prompt = layer.apply(params, x), 5
  context = lambda length: {"lengths": jnp.full((2,), length), "rope_start": jnp.zeros((2,), jnp.int32),
                            "segments": jnp.zeros((2, 9), jnp.int32)}
  out, cache = layer.apply(params, x[:, :prompt], cache=init_layer_cache(cfg, 2, 9), context=context(prompt))
  pieces = [out]
  for position in range(prompt, 9):
    out, cache = layer.apply(params, x[:, position:position + 1], cache=cache, context=context(position))
    pieces.append(out)
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)
  with pytest.raises(ValueError, match="without KV-shift"):  # the window cache streams without it
    layer.apply(params, x, cache=init_window_cache(dataclasses.replace(cfg, window=4), 2), context={"position": 0})
