"""PMT: the two PMA execution modes, the window geometry, the masks, the receptive field, the
memory's history bound, missing values and configuration errors."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.config import ConfigError
from lpcjax.layers.pma import PMABlock, PMAConfig, PMAStack, copy_layout, num_windows
from lpcjax.models import PMT, PMTConfig

SMALL = PMAConfig(d_model=16, num_heads=2, mlp_dim=32, num_slots=2)


def init(module, *args):
  """Jitted init (an eager init of nn.scan traces op by op: ten times slower)."""
  return jax.jit(module.init)(jax.random.PRNGKey(1), *args)


def apply(module, variables, *args, **kwargs):
  return jax.jit(lambda v, *a: module.apply(v, *a, **kwargs))(variables, *args)


def perturbed(variables, scale=0.1, seed=7):
  """Variables with every param moved off its init (the read path and the gates start at 0)."""
  leaves, tree = jax.tree.flatten(variables)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree.unflatten(tree, [a + scale * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])


def block_inputs(k, batch=3, d=16, invalid_tail=3):
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, k, d))
  valid = jnp.ones((batch, k), bool).at[1, k - invalid_tail:].set(False)
  return x, valid


@pytest.mark.parametrize("k,window,stride,memory", [(23, 5, 2, "progressive"),  # odd W: 3 copies, a tail
                                                    (17, 4, 4, "stateless"),  # no overlap
                                                    (12, 12, 6, "progressive"),  # one window
                                                    (30, 7, 3, "stateless")])
def test_streaming_equals_vectorized(k, window, stride, memory):
  config = dataclasses.replace(SMALL, memory=memory)
  x, valid = block_inputs(k)
  stack = PMAStack(config, 2, window, stride)
  variables = perturbed(init(stack, x, valid))
  out, memories = apply(stack, variables, x, valid)
  streaming = PMAStack(dataclasses.replace(config, streaming=True), 2, window, stride)
  out_s, memories_s = apply(streaming, variables, x, valid)
  assert memories.shape == (3, (k - window) // stride + 1, 2, 16)
  np.testing.assert_allclose(out_s, out, atol=1e-5, rtol=0)
  np.testing.assert_allclose(memories_s, memories, atol=1e-5, rtol=0)


def test_model_modes_agree_and_missing_values_are_masked():
  config = PMTConfig(d_model=16, num_heads=2, num_blocks=2, num_slots=2, tokenizer_kernels=8, projection_dim=16,
                     patch_size=4, patch_stride=2)
  x = np.random.default_rng(0).normal(size=(3, 64, 2)).astype(np.float32)
  x[1, 40:] = np.nan  # a shorter series
  x[2, 5, 1] = np.nan  # one missing sample
  model = PMT(config)
  variables = perturbed(init(model, x[:1]))
  out = apply(model, variables, x)
  out_s = apply(PMT(dataclasses.replace(config, streaming=True)), variables, x)
  for name in ("cls", "tokens", "memories", "memory_z"):
    assert np.isfinite(out[name]).all(), name
    np.testing.assert_allclose(out_s[name], out[name], atol=1e-5, rtol=0)
  assert not out["token_valid"][1, -5:].any() and out["token_valid"][2].all()


def test_number_of_windows_and_copies():
  for k, window, stride in [(500, 100, 25), (37, 7, 3), (10, 10, 5), (11, 4, 2)]:
    n = num_windows(k, window, stride)
    assert n == (k - window) // stride + 1
    window_of, offset, exists = copy_layout(k, window, stride)
    covered = np.zeros(k, int)
    for p in range(k):
      for w, off, e in zip(window_of[p], offset[p], exists[p]):
        if e:
          assert w * stride + off == p and 0 <= w < n and 0 <= off < window
          covered[p] += 1
    expected = [sum(w * stride <= p < w * stride + window for w in range(n)) for p in range(k)]
    np.testing.assert_array_equal(covered, expected)


def test_tokens_never_read_the_current_write_slots():
  """One window (K = W): changing M_0, hence M_cur, changes the memory but no token output."""
  x, valid = block_inputs(8, invalid_tail=0)
  block = PMABlock(SMALL, 8, 4)
  variables = perturbed(init(block, x, valid))
  out, memory = apply(block, variables, x, valid)
  changed = jax.tree_util.tree_map_with_path(
      lambda path, a: a + 1.0 if "base_state" in jax.tree_util.keystr(path) else a, variables)
  out2, memory2 = apply(block, changed, x, valid)
  np.testing.assert_array_equal(out2, out)
  assert np.abs(memory2 - memory).max() > 1e-3


def test_carry_gate_copies_the_block_below_when_closed_and_resets_when_open():
  """M_cur = RMSNorm(M̃ + g (M_0 − M̃)): g → 0 copies the lower block's memory of the same
  window, g → 1 resets to M_0."""
  x, valid = block_inputs(20, invalid_tail=0)
  block = PMABlock(SMALL, 6, 3)
  variables = perturbed(init(block, x, valid))
  lower = jax.random.normal(jax.random.PRNGKey(3), (3, 5, 2, 16))
  noise = jnp.zeros_like(lower)
  def slots(logit, lower):
    changed = jax.tree_util.tree_map_with_path(
        lambda path, a: jnp.full_like(a, logit) if "carry_gate" in jax.tree_util.keystr(path) else a, variables)
    return apply(block, changed, lower, noise, method=PMABlock.write_slots)
  norm = lambda a: apply(block, variables, a, method=lambda mdl, a: mdl.state_norm(a))
  np.testing.assert_allclose(slots(-30.0, lower), norm(lower), atol=1e-5)
  base = nn.meta.unbox(variables["params"]["base_state"])
  np.testing.assert_allclose(slots(30.0, lower), norm(jnp.broadcast_to(base, lower.shape)), atol=1e-5)


def _receptive_field(memory):
  """|∂ (last window's memory of the last block) / ∂ input token| for K=500, W=100, S=25, B=4."""
  config = PMAConfig(d_model=8, num_heads=2, mlp_dim=16, num_slots=1, memory=memory)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 500, 8))
  valid = jnp.ones((1, 500), bool)
  stack = PMAStack(config, 4, 100, 25)
  variables = perturbed(init(stack, x, valid))
  grad = jax.jit(jax.grad(lambda x: stack.apply(variables, x, valid)[1][:, -1].sum()))(x)
  return np.abs(np.asarray(grad[0])).sum(-1)


def test_receptive_field_example():
  """the PMT spec §3: N = 17; with memory the last window's memory depends on every token; a
  stateless stack sees only the tokens its overlaps reach (not the start)."""
  progressive = _receptive_field("progressive")
  assert (progressive > 0).all()
  stateless = _receptive_field("stateless")
  assert (stateless[:100] == 0).all() and (stateless[-100:] > 0).all()


def test_memory_depends_only_on_the_past():
  """In a block, window w's memory reads tokens up to the end of window w, never later ones."""
  x, valid = block_inputs(20, invalid_tail=0)
  block = PMABlock(SMALL, 6, 3)
  variables = perturbed(init(block, x, valid))
  _, memories = apply(block, variables, x, valid)
  _, changed = apply(block, variables, x.at[:, 12:].add(1.0), valid)
  last_before = (12 - 6) // 3  # windows 0..2 end before token 12
  np.testing.assert_array_equal(changed[:, :last_before + 1], memories[:, :last_before + 1])
  assert np.abs(changed[:, last_before + 1:] - memories[:, last_before + 1:]).max() > 1e-4


def test_baseline_memories_are_window_means():
  config = PMTConfig(d_model=16, num_heads=2, num_blocks=1, tokenizer_kernels=8, projection_dim=16, patch_size=4,
                     patch_stride=2, attention="full", post_layers=1)
  x = np.random.default_rng(0).normal(size=(2, 40, 1)).astype(np.float32)
  model = PMT(config)
  variables = init(model, x[:1])
  out, state = apply(model, variables, x, capture_intermediates=lambda mdl, _: mdl.name == "blocks_norm")
  tokens = state["intermediates"]["blocks_norm"]["__call__"][0]
  window, stride, n = config.geometry(tokens.shape[1])
  expected = np.stack([tokens[:, w * stride:w * stride + window].mean(1) for w in range(n)], 1)
  np.testing.assert_allclose(out["memories"][:, :, 0], expected, atol=1e-6)


def test_streaming_working_memory_does_not_grow_with_the_sequence():
  """Compiled forward temp memory: vectorized grows with K (materialized overlaps and per-window
  attention); streaming holds O windows and its output (benchmarks/pmt_modes.py measures more)."""
  def temp_and_output(k, streaming):
    block = PMABlock(dataclasses.replace(SMALL, num_slots=1, streaming=streaming), 16, 8)
    x, valid = jnp.zeros((2, k, 16)), jnp.ones((2, k), bool)
    variables = init(block, x, valid)
    memory = jax.jit(lambda v, x: block.apply(v, x, valid)).lower(variables, x).compile().memory_analysis()
    return memory.temp_size_in_bytes, memory.output_size_in_bytes
  (vec_small, _), (vec_large, _) = temp_and_output(256, False), temp_and_output(2048, False)
  (stream_small, out_small), (stream_large, out_large) = temp_and_output(256, True), temp_and_output(2048, True)
  output_growth = out_large - out_small
  assert stream_large - stream_small < 2 * output_growth
  assert vec_large - vec_small > 5 * output_growth


def test_configuration_errors_are_one_line():
  config = PMTConfig(patch_size=16, patch_stride=8, window_tokens=50)
  with pytest.raises(ConfigError, match="shorter than one patch"):
    config.num_tokens(10)
  with pytest.raises(ConfigError, match="longer than the"):
    config.geometry(config.num_tokens(100))
  with pytest.raises(ConfigError, match="model.attention"):
    PMTConfig(attention="linear")
  with pytest.raises(ConfigError, match="every loss weight is 0"):
    PMTConfig(icl_weight=0, hgcl_weight=0, pcl_weight=0)
