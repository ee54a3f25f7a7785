import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import experiment as C
from lpcjax import models
from lpcjax.data import TokenWindowSource
from lpcjax.losses import lm_loss
from lpcjax.models.sith import slot_token_mask
from lpcjax.training import train

from conftest import tiny_experiment


def build(delta_pulse=False):
  cfg = models.SITHConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=4, mlp_dim=64, num_filters=13,
                          k=50, chunk_len=10, delta_pulse=delta_pulse)
  model = models.get("sith").build(cfg)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, cfg.window_len), jnp.int32))
  return cfg, model, params


def test_slot_token_mask():
  mask = np.asarray(slot_token_mask(2, 3))
  np.testing.assert_array_equal(mask, [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0],
                                       [1, 1, 1, 1, 1]])


@pytest.mark.parametrize("delta_pulse", [False, True])
def test_causal_and_the_history_matters(delta_pulse):
  cfg, model, params = build(delta_pulse)
  apply = jax.jit(model.apply)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 50, (2, cfg.window_len)))
  logits = apply(params, tokens)
  assert logits.shape == (2, cfg.chunk_len, 50)
  history = cfg.history_len
  for t in (0, 4, cfg.chunk_len - 2):  # t indexes the chunk; window position history + t
    changed = apply(params, tokens.at[:, history + t + 1:].set((tokens[:, history + t + 1:] + 3) % 50))
    np.testing.assert_allclose(changed[:, :t + 1], logits[:, :t + 1], atol=1e-5)
    assert not np.allclose(changed[:, t + 1:], logits[:, t + 1:])
  older = apply(params, tokens.at[:, history - 1].set((tokens[:, history - 1] + 1) % 50))
  assert not np.allclose(older, logits)  # the slots carry the history


def test_loss_counts_exactly_the_chunk():
  cfg, model, params = build()
  rng = np.random.default_rng(1)
  batch = {"inputs": jnp.asarray(rng.integers(0, 50, (3, cfg.window_len))),
           "targets": jnp.asarray(rng.integers(0, 50, (3, cfg.window_len))),
           "loss_mask": jnp.ones((3, cfg.window_len))}
  loss, metrics, _ = lm_loss(model.apply, params["params"], batch)
  assert float(metrics["loss"][1]) == 3 * cfg.chunk_len
  logits = np.asarray(model.apply(params, batch["inputs"]), np.float64)
  targets = np.asarray(batch["targets"])[:, -cfg.chunk_len:]
  log_z = np.log(np.exp(logits).sum(-1))
  direct = (log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]).mean()
  assert float(loss) == pytest.approx(direct, rel=1e-5)


def test_stride_m_windows_predict_every_token_once():
  cfg, _, _ = build()
  tokens = np.arange(100)
  source = TokenWindowSource(tokens, [0], cfg.window_len, stride=cfg.chunk_len)
  predicted = np.concatenate([source[i]["targets"][-cfg.chunk_len:] for i in range(len(source))])
  np.testing.assert_array_equal(predicted, np.arange(cfg.history_len + 1, cfg.history_len + 1 + len(predicted)))


def test_sith_trains_through_the_shared_harness(tmp_path):
  base = tiny_experiment(tmp_path, "train.steps=3", "train.warmup_steps=1", "train.mesh_data=1",
                         "data.mqar_num_pairs=2", name="sith")
  model = models.SITHConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=4, mlp_dim=64, num_filters=9,
                            k=50, chunk_len=12)
  message = r"data.seq_len: the sith model reads the last 16 tokens \(H \+ m\) .* needs seq_len >= 16, got 12"
  with pytest.raises(C.ConfigError, match=message):
    C.ExperimentConfig(model=model, data=dataclasses.replace(base.data, seq_len=12), train=base.train)
  cfg = C.ExperimentConfig(model=model, data=dataclasses.replace(base.data, seq_len=16), train=base.train,
                           name="sith")
  _, summary = train(cfg, progress=False, devices=jax.devices()[:1])
  # MQAR scores only the answers, and SITH only those among the last 12 positions of each window.
  assert summary["family"] == "sith" and 0 < summary["eval_weight"] <= 2 * 8 * 12
  assert np.isfinite(summary["eval_loss"])
