"""model.attention_impl=triton in the models: FoX with scanned, rematted layers gives the XLA
backend's logits and gradients, and cached decoding (whose prefill runs the kernel) equals the
full forward. The kernels run under the Triton interpreter (tests/triton_interpreted.py);
skipped where torch or triton is not installed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import test_generation  # noqa: E402
import triton_interpreted  # noqa: E402
from lpcjax import config as C  # noqa: E402
from lpcjax import models  # noqa: E402
from lpcjax.kernels import triton_backend  # noqa: E402


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
  monkeypatch.setattr(triton_backend, "launcher", triton_interpreted.interpreted_launcher())


def test_fox_with_remat_equals_xla():
  family = models.get("fox")
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 48, (2, 24)), jnp.int32)
  build = lambda impl: family.build(family.config_cls(
      **{**test_generation.TINY, "num_layers": 1}, block="pro", attention_impl=impl,
      remat_policy="full"))
  params = jax.jit(build("xla").init)(jax.random.PRNGKey(0), tokens)  # the same for both

  def logits_and_grads(impl):
    model = build(impl)

    def loss(p):
      logits = model.apply(p, tokens)
      return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return logits, grads

  logits, grads = logits_and_grads("triton")
  expected_logits, expected_grads = logits_and_grads("xla")
  np.testing.assert_allclose(logits, expected_logits, atol=2e-5)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_cached_decoding_with_triton_prefill():
  test_generation.test_decode_steps_equal_full_forward("fox", "llama", "triton", None)


def test_config_override_selects_triton(repo_root):
  cfg = C.apply_overrides(C.load_experiment(str(repo_root / "configs" / "fox_tiny_mqar.py")),
                          ["model.attention_impl=triton"])
  assert cfg.model.attention_impl == "triton"
