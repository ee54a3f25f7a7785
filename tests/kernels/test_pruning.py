"""Block skipping (prune_epsilon): outputs stay within the stated bound of the exact result."""


import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax.kernels import BlockSizes, forgetting_attention
from lpcjax.kernels.pruning import DEFAULT_EPSILON, skipped_tile_fraction

from test_forgetting_attention import INTERPRET, value_and_grads

IMPLS = ["xla", "pallas"]


def decaying_inputs(seed, seq_len=128, heads=2, head_dim=16, log_f=-2.0):
  rng = np.random.default_rng(seed)
  q, k, v, do = (jnp.asarray(rng.normal(size=(1, seq_len, heads, head_dim)), jnp.float32) for _ in range(4))
  gates = jnp.full((1, seq_len, heads), log_f, jnp.float32)
  return q, k, v, gates, do


def run(impl, q, k, v, log_f, **kw):
  return forgetting_attention(q, k, v, log_f, impl=impl, interpret=INTERPRET.get(impl, False),
                              block_sizes=BlockSizes(16, 16), **kw)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("epsilon", [DEFAULT_EPSILON, 1e-2])
def test_pruned_output_within_bound(impl, epsilon):
  q, k, v, log_f, _ = decaying_inputs(0)
  fraction = skipped_tile_fraction(q, k, log_f, block_q=16, block_k=16, epsilon=epsilon)
  assert fraction > 0.5  # most tiles are skipped (all but the diagonal and its neighbours)
  exact = run("reference", q, k, v, log_f)
  pruned = run(impl, q, k, v, log_f, prune_epsilon=epsilon)
  bound = 2 * epsilon * float(jnp.max(jnp.abs(v)))
  assert float(jnp.max(jnp.abs(pruned - exact))) <= bound + 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_pruned_gradients_match_exact_for_small_epsilon(impl):
  q, k, v, log_f, do = decaying_inputs(1, seq_len=64)
  _, exact = value_and_grads("reference", q, k, v, log_f, do)
  _, pruned = value_and_grads(impl, q, k, v, log_f, do, prune_epsilon=DEFAULT_EPSILON,
                              block_sizes=BlockSizes(16, 16))
  for a, b in zip(pruned, exact):
    np.testing.assert_allclose(a, b, atol=1e-3)


@pytest.mark.parametrize("impl", IMPLS)
def test_no_decay_means_nothing_skipped(impl):
  q, k, v, log_f, _ = decaying_inputs(2, seq_len=64, log_f=0.0)
  assert skipped_tile_fraction(q, k, log_f, block_q=16, block_k=16) == 0.0
  np.testing.assert_allclose(run(impl, q, k, v, log_f, prune_epsilon=0.1), run(impl, q, k, v, log_f),
                             atol=1e-6)


def test_prune_epsilon_is_checked():
  q, k, v, log_f, _ = decaying_inputs(0, seq_len=16)
  with pytest.raises(ValueError, match="prune_epsilon"):
    forgetting_attention(q, k, v, log_f, prune_epsilon=2.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_skipped_tiles_are_really_not_read(impl):
  """Huge values in the first key block move the exact output of the last query block, but not
  the pruned one: the kernel skipped that tile."""
  q, k, v, _, _ = decaying_inputs(3)
  q, k = 0.1 * q, 0.1 * k  # small norms: a tight threshold, so the skipped weight is visible
  log_f = jnp.full(q.shape[:3], -0.12, jnp.float32)
  loud = v.at[:, :16].set(1e4)
  exact_shift = run("reference", q, k, loud, log_f)[:, -16:] - run("reference", q, k, v, log_f)[:, -16:]
  assert float(jnp.max(jnp.abs(exact_shift))) > 1e-2
  pruned_shift = (run(impl, q, k, loud, log_f, prune_epsilon=1e-2)[:, -16:]
                  - run(impl, q, k, v, log_f, prune_epsilon=1e-2)[:, -16:])
  assert float(jnp.max(jnp.abs(pruned_shift))) == 0.0
