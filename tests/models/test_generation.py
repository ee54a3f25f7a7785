"""Cached decoding: every decode step's logits equal a full forward over the same prefix
(transformer and fox, LLaMA and Pro blocks, reference and xla prefill, prompts of different
lengths with segment ids; LPC-SM across chunk boundaries and past its window; SITH against its
windowed forward); greedy = repeated argmax; seeded sampling; top-k/top-p sets; one
compilation of the decode loop; early stop, and LPC-SM's stop head; sharded caches; one-line
errors; the CLI."""

import argparse
import dataclasses
import functools

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import models
from lpcjax.decoding import GREEDY, GenerationError, Sampling, _decode_jit, generate, sample
from lpcjax.evaluation import score_generated
from lpcjax.models.decoder import init_cache
from lpcjax.models.lpcsm import stop_on_head
from lpcjax.sharding import DEFAULT_RULES

TINY = dict(vocab_size=48, d_model=32, num_layers=2, num_heads=2, mlp_multiple_of=16)


def build(family, **fields):
  family = models.get(family)
  model = family.build(family.config_cls(**{**TINY, **fields}))
  return family, model, jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))


CASES = [(family, block, "xla", None) for family in ("fox", "transformer") for block in ("llama", "pro")]
CASES += [("fox", "pro", "reference", None), ("fox", "llama", "xla", 3)]  # 3: sliding-window attention


@pytest.mark.parametrize("family,block,impl,window", CASES)
def test_decode_steps_equal_full_forward(family, block, impl, window):
  _, model, params = build(family, block=block, attention_impl=impl, attention_window=window)
  check_decoding_equals_full_forward(model, params)


def test_grouped_query_cache_holds_the_kv_heads_only_and_decodes_as_the_full_forward():
  """num_kv_heads=2 of 4 heads (Pro: KV-shift state too): the cache's k, v and KV-shift state
  hold two heads, half the bytes of the multi-head cache, c stays per query head; each decode
  step equals the full forward."""
  _, model, params = build("fox", block="pro", num_heads=4, num_kv_heads=2)
  cache = init_cache(model.config, 3, 16)["layers"]
  full = init_cache(models.get("fox").config_cls(**{**TINY, "num_heads": 4}, block="pro"), 3, 16)["layers"]
  head_dim = TINY["d_model"] // 4
  assert cache["k"].shape == cache["v"].shape == (2, 3, 16, 2, head_dim)
  assert cache["k_prev"].shape == (2, 3, 2, head_dim) and cache["c"].shape == (2, 3, 16, 4)
  kv_bytes = lambda c: sum(c[name].nbytes for name in ("k", "v", "k_prev", "v_prev"))
  assert 2 * kv_bytes(cache) == kv_bytes(full)
  check_decoding_equals_full_forward(model, params)


def check_decoding_equals_full_forward(model, params):
  rng = np.random.default_rng(0)
  full = rng.integers(0, 48, (3, 14)).astype(np.int32)
  segments = np.zeros((3, 14), np.int32)
  segments[1, 3:], segments[2, 2:], segments[2, 6:] = 1, 4, 5  # packed rows: decode continues the last segment
  reference = np.asarray(jax.jit(model.apply)(params, full, segments))
  lengths = np.array([5, 7, 8])
  cache = {**init_cache(model.config, 3, 16), "lengths": jnp.asarray(lengths, jnp.int32)}
  logits, cache = jax.jit(model.apply)(params, full[:, :8], segments[:, :8], cache)  # right-padded prompts
  rows = np.arange(3)
  np.testing.assert_allclose(np.asarray(logits)[rows, lengths - 1], reference[rows, lengths - 1], atol=1e-5)
  step = jax.jit(lambda p, token, c: model.apply(p, token, None, c))
  for t in range(6):
    logits, cache = step(params, full[rows, lengths + t][:, None], cache)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], reference[rows, lengths + t], atol=1e-5)
  np.testing.assert_array_equal(cache["lengths"], lengths + 6)


def test_greedy_is_repeated_argmax_and_compiles_once():
  family, model, params = build("fox", block="pro")
  prompts = [[1, 2, 3, 4, 5], [7, 8], list(range(9, 29))]
  before = _decode_jit._cache_size()
  result = generate(family, model, params, prompts, max_new_tokens=5, max_len=32)
  forward = jax.jit(model.apply)  # causal: logits at position t of a padded row are the prefix's
  for prompt, generated in zip(prompts, result.tokens):
    sequence = list(prompt)
    for _ in range(5):
      padded = np.zeros((1, 32), np.int32)
      padded[0, :len(sequence)] = sequence
      sequence.append(int(np.argmax(forward(params, padded)[0, len(sequence) - 1])))
    assert generated == sequence[len(prompt):]
  # other prompt lengths (another prefill bucket) and another number of new tokens: same loop
  generate(family, model, params, [[3], list(range(40))[:17], [5, 6]], max_new_tokens=3, max_len=32)
  assert _decode_jit._cache_size() == before + 1


def test_sampling_is_seeded_and_stays_in_the_allowed_set():
  family, model, params = build("transformer")
  prompts = [[1, 2, 3], [4, 5]]
  draw = lambda seed, sampling: generate(family, model, params, prompts, max_new_tokens=8, sampling=sampling,
                                         seed=seed).tokens
  hot = Sampling(temperature=2.0)
  assert draw(3, hot) == draw(3, hot) and draw(3, hot) != draw(4, hot)
  assert draw(5, Sampling(temperature=1.0, top_k=1)) == draw(0, GREEDY)

  logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, 48)), jnp.float32)
  keys = jax.random.split(jax.random.PRNGKey(0), 200)
  draws = lambda sampling: np.asarray(jax.jit(jax.vmap(lambda k: sample(logits, k, sampling)))(keys))
  top_k = draws(Sampling(top_k=5))
  allowed = np.argsort(-np.asarray(logits), axis=-1)[:, :5]
  assert all(set(top_k[:, row]) <= set(allowed[row]) for row in range(4))
  top_p = draws(Sampling(top_p=0.6))
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  for row in range(4):
    order = np.argsort(-probs[row])
    mass_before = np.cumsum(probs[row][order]) - probs[row][order]
    nucleus = set(order[mass_before < 0.6])
    assert set(top_p[:, row]) <= nucleus and len(set(top_p[:, row])) > 1


def test_rows_stop_at_the_end_token_independently():
  family, model, params = build("fox")
  prompts = [[1, 2, 3], [9, 9, 9, 9]]
  free = generate(family, model, params, prompts, max_new_tokens=6).tokens
  end = free[0][2]  # the third token row 0 emits
  stopped = generate(family, model, params, prompts, max_new_tokens=6, end_token=end).tokens
  assert stopped[0] == free[0][:3]
  assert stopped[1] == (free[1][:free[1].index(end) + 1] if end in free[1] else free[1])


def test_sharded_decoding_equals_unsharded_and_shards_the_cache():
  family, model, params = build("fox", block="pro", num_heads=2)
  prompts = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 10]]
  expected = generate(family, model, params, prompts, max_new_tokens=4).tokens
  mesh = jax.make_mesh((4, 1, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3,
                       devices=jax.devices()[:8])
  with jax.set_mesh(mesh), nn.logical_axis_rules(DEFAULT_RULES):
    assert generate(family, model, params, prompts, max_new_tokens=4).tokens == expected
    cache = {**init_cache(model.config, 4, 16), "lengths": jnp.full((4,), 3, jnp.int32)}
    _, cache = jax.jit(model.apply)(params, jnp.ones((4, 8), jnp.int32), None, cache)
  spec = cache["layers"]["k"].sharding.spec  # [layers, batch, max_len, heads, head_dim]
  assert spec[1] in ("data", ("data", "fsdp")) and spec[3] == "tensor"


def test_errors_are_one_line():
  family, model, params = build("fox")
  with pytest.raises(GenerationError, match="exceeds max_len"):
    generate(family, model, params, [[1] * 10], max_new_tokens=8, max_len=16)
  with pytest.raises(GenerationError, match="at least one token"):
    generate(family, model, params, [[]], max_new_tokens=2)
  with pytest.raises(GenerationError, match="top_p"):
    Sampling(top_p=0.0)
  pmt = models.get("pmt")
  with pytest.raises(GenerationError, match="pmt family cannot decode token by token: it is a time-series") as error:
    generate(pmt, None, None, [[1]], max_new_tokens=1)
  assert "init_cache" not in str(error.value)  # the user's words, not the code's
  with pytest.raises(GenerationError, match="stop_when needs the end_token"):
    generate(family, model, params, [[1]], max_new_tokens=1, stop_when=lambda cache: True)
  # LPC-SM's stop head is its family's rule (Family.stop_rule), with its own one-line errors
  lpcsm = models.get("lpcsm")
  headless = lpcsm.build(models.LPCSMConfig(vocab_size=48, d_model=32, num_layers=1, num_heads=2, chunk_size=4,
                                            mlp_multiple_of=32, memory_dim=16, stop_head=False))
  with pytest.raises(GenerationError, match="--stop-head: needs a model with a stop head"):
    lpcsm.stop_rule.resolve(headless, argparse.Namespace(stop_head=0.5), None)
  assert lpcsm.stop_rule.resolve(headless, argparse.Namespace(stop_head=None), 7) == (None, 7)
  with pytest.raises(GenerationError, match=r"--stop-head: must be a probability in \(0, 1\), got 1.5"):
    stop_on_head(lpcsm.build(dataclasses.replace(headless.config, stop_head=True)), 1.5)


def test_generate_command_streams_tokens(tmp_path, capsys):
  from conftest import tiny_experiment
  from lpcjax.generate import main
  from lpcjax.training import train

  config = tiny_experiment(tmp_path, "train.steps=2", "train.warmup_steps=1", "train.log_every=1",
                           "train.eval_batches=1", name="gen")
  run_dir, _ = train(config, progress=False)
  capsys.readouterr()
  assert main(["--run", str(run_dir), "--token-ids", "1,2,3", "--max-new-tokens", "4"]) == 0
  out, err = capsys.readouterr()
  printed = out.split()  # MQAR runs have no tokenizer: ids are printed, the prompt's first
  assert printed[:3] == ["1", "2", "3"] and len(printed) == 7
  assert all(0 <= int(t) < config.model.vocab_size for t in printed)
  *notes, speed = err.strip().splitlines()
  assert re.fullmatch(r"4 new tokens in [\d.]+ s: [\d.]+ tokens/s \(prefill and compilation included\)", speed)
  if len(set(printed[3:])) == 1:  # a 2-step model repeating one token is told why, in one line
    assert notes == ["note: every continuation repeats one token: a model at step 2 has not learnt enough to "
                     "generate text; train it longer (train.steps), or sample (--temperature 0.8)"]
  else:
    assert notes == []
  assert main(["--run", str(run_dir), "--token-ids", "1,2,3", "--max-new-tokens", "4", "--no-echo"]) == 0
  assert capsys.readouterr().out.split() == printed[3:]  # greedy: the same continuation, alone
  assert main(["--run", str(run_dir), "--token-ids", "1,2,999999"]) == 2
  err = capsys.readouterr().err.strip()
  assert "prompt token ids must be in" in err and len(err.splitlines()) == 1
  for prompt, expected in ((["--token-ids", "5,a,3"], "--token-ids: 'a' is not a token id"),
                           (["--prompt", "two words"], "this run has no tokenizer"),  # not "could not download"
                           (["--prompt", ""], "this run has no tokenizer")):
    assert main(["--run", str(run_dir), *prompt]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1
  # --stop-head is lpcsm's flag (its Family.stop_rule), not generate's: a fox run has no such flag
  with pytest.raises(SystemExit):
    main(["--run", str(run_dir), "--token-ids", "1", "--stop-head", "0.5"])
  assert "unrecognized arguments: --stop-head 0.5" in capsys.readouterr().err
  with pytest.raises(SystemExit) as help_exit:  # --help without a run: argparse's help, not an error
    main(["--help"])
  assert help_exit.value.code == 0 and "--max-new-tokens" in capsys.readouterr().out
  assert main(["--run", str(tmp_path / "nowhere"), "--token-ids", "1"]) == 2
  assert capsys.readouterr().err.strip().endswith("nowhere: no such folder (a run directory is "
                                                  "train.run_dir/train.run_name, e.g. runs/NAME)")
  # past the training length (32): said, with what the family was measured to do there
  assert main(["--run", str(run_dir), "--token-ids", ",".join(["1"] * 30), "--max-new-tokens", "4"]) == 0
  notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
  assert notes == ["warning: prompt + new tokens = 34 tokens, past the training length of 32; what lpcjax measured "
                   "there for fox: its MQAR recall stayed at 100 % at 2x and 4x the training length (Pro block, 3 "
                   "seeds) and its loss on held-out books stayed level to 4x (docs/mechanisms.md, docs/evaluation.md)"]


def test_a_continuation_of_one_repeated_token_gets_a_one_line_hint():
  from lpcjax.generate import undertrained_hint
  hint = undertrained_hint([[262, 262, 262, 262], [11, 11, 11, 11, 11]], step=30)
  assert hint.startswith("note: every continuation repeats one token: a model at step 30") and "\n" not in hint
  assert undertrained_hint([[262, 262, 262, 262], [11, 12, 11, 11]], step=30) is None  # one row varies
  assert undertrained_hint([[262, 262]], step=30) is None  # too short to tell


@pytest.mark.parametrize("text", ["He said \u201cyes\u201d.",
                                  "caf\u00e9 \U0001f600\U0001f44d\U0001f3fd ok",
                                  "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0 \u2014 done"])
def test_streamed_text_is_what_batch_decoding_prints(gpt2_rank_file, text):
  """A character split across GPT-2 tokens streams whole (it once printed as U+FFFD twice)."""
  import io
  from lpcjax.data import load_gpt2_tokenizer
  from lpcjax.generate import TextStream
  from lpcjax.decoding import TokenPrinter
  tokenizer = load_gpt2_tokenizer(gpt2_rank_file)
  ids = tokenizer.encode_ordinary(text)
  assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # the case that used to garble
  for sequence in (ids, ids[:-1], [*ids[:3], 50256, *ids[3:]]):  # cut mid-character, end-of-text
    out, stream = io.StringIO(), TextStream(tokenizer)
    printer = TokenPrinter(stream, out)
    for step, token in enumerate(sequence):
      printer(step, np.array([token]))
    out.write(stream.flush())
    assert out.getvalue() == tokenizer.decode([t for t in sequence if t < tokenizer.n_vocab])


# ------------------------------------------------------------------ recurrent caches: lpcsm, sith

def _perturbed(variables, seed=5, scale=0.3):
  """Every parameter moved off its init (zero memory reads and correction, identity mHC, α = 0),
  so that each path of the step is exercised."""
  leaves, tree = jax.tree.flatten(nn.meta.unbox(variables))
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


@functools.cache
def lpcsm_setup():
  """A tiny LPC-SM with every mechanism on and every parameter moved (the correction's W_c
  nonzero), and its jitted forward (logits, extras), shared by the tests below. Window 6 and
  chunks of 4: 20 positions cross 4 chunk boundaries and run past the window."""
  config = models.LPCSMConfig(vocab_size=48, d_model=32, num_layers=2, num_heads=2, mlp_multiple_of=32,
                              attention_window=6, chunk_size=4, memory_dim=16, num_streams=3, attention_impl="xla",
                              position_embedding="sinusoidal", correction_init_std=0.5)
  family = models.get("lpcsm")
  model = family.build(config)
  params = _perturbed(jax.jit(model.init)(jax.random.PRNGKey(1), jnp.zeros((1, 8), jnp.int32)))
  return family, model, params, jax.jit(lambda p, x: model.apply(p, x, return_aux=True))


def assert_steps_equal(family, model, params, full, reference, lengths, steps):
  """Prefill right-padded prompts of ``lengths`` with the family's prefill, then decode
  ``steps`` tokens; every step's logits equal ``reference`` [batch, T, vocab] at its position."""
  rows = np.arange(len(lengths))
  cache = family.init_cache(model.config, len(lengths), None)
  prompts = jnp.asarray(np.where(np.arange(full.shape[1])[None] < lengths[:, None], full, 0)[:, :max(lengths)])
  last, cache = jax.jit(lambda p, x, c: family.prefill(model, p, x, None, c, jnp.asarray(lengths)))(params, prompts,
                                                                                                      cache)
  np.testing.assert_allclose(np.asarray(last), reference[rows, lengths - 1], atol=1e-5, rtol=1e-5)
  step = jax.jit(lambda p, token, c: model.apply(p, token, None, c))
  for t in range(steps):
    logits, cache = step(params, full[rows, lengths + t][:, None], cache)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], reference[rows, lengths + t], atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(cache["position"], lengths + steps)


def test_lpcsm_decode_steps_equal_full_forward():
  """Prompts of 3 and 6 tokens, then 14 steps: positions 3..19, past the window (6) and across
  the chunk boundaries at 4, 8, 12, 16."""
  family, model, params, forward = lpcsm_setup()
  full = np.random.default_rng(0).integers(0, 48, (2, 20)).astype(np.int32)
  assert_steps_equal(family, model, params, full, np.asarray(forward(params, full)[0]), np.array([3, 6]), 14)


def test_lpcsm_generate_is_greedy_and_the_stop_head_can_end_it():
  """With the stop head's rule (``stop_on_head(model, p)``, ``--stop-head P``) a row ends, with
  the stop token, at the first step whose stop probability exceeds p; every token before it is
  the full forward's argmax. (Off by default: the other generate tests run without it.)"""
  family, model, params, forward = lpcsm_setup()
  prompts = [[1, 2, 3, 4, 5], [7, 8]]
  probe = np.random.default_rng(2).integers(0, 48, (2, 20)).astype(np.int32)
  threshold = float(np.quantile(jax.nn.sigmoid(forward(params, probe)[1]["stop_logits"]), 0.7))
  result = generate(family, model, params, prompts, max_new_tokens=10, **stop_on_head(model, threshold)).tokens
  stop_token = model.config.resolved_stop_token
  padded = np.zeros((2, 20), np.int32)
  for row, (prompt, generated) in enumerate(zip(prompts, result)):
    padded[row, :len(prompt) + len(generated)] = prompt + generated
  logits, extras = forward(params, padded)
  stopped = 0
  for row, (prompt, generated) in enumerate(zip(prompts, result)):
    positions = np.arange(len(prompt) - 1, len(prompt) + len(generated) - 1)  # where each token was drawn
    fired = np.asarray(jax.nn.sigmoid(extras["stop_logits"][row, positions])) > threshold
    greedy = np.argmax(logits[row, positions], axis=-1).tolist()
    if fired.any():
      assert fired.tolist() == [False] * (len(generated) - 1) + [True] and generated[-1] == stop_token
      stopped += 1
    assert generated[:len(generated) - int(fired.any())] == greedy[:len(generated) - int(fired.any())]
  assert stopped and any(len(row) < 10 for row in result)
  # the needle test's generate mode (score_generated) scores LPC-SM through the same generate
  examples = [(np.asarray(prompt + generated), 0, len(prompt)) for prompt, generated in zip(prompts, result)]
  decode = lambda prompts, n: generate(family, model, params, prompts, max_new_tokens=n,
                                       **stop_on_head(model, threshold)).tokens
  assert score_generated(decode, examples) == 1.0


@pytest.mark.parametrize("delta_pulse,scan_layers", [(False, True), (True, False)])
def test_sith_decode_steps_equal_its_windowed_forward(delta_pulse, scan_layers):
  """SITH's logits at position t are ``windowed_logits``'s (t's chunk of m = 5 and the H tokens
  before it, the fill token before the sequence): prompts of 2 and 7 tokens, 12 steps, across
  three chunk starts, with the history (H = 8 compressed, L = 13 delta) longer than a chunk."""
  from lpcjax.models.sith import windowed_logits
  family = models.get("sith")
  config = models.SITHConfig(vocab_size=48, d_model=32, num_layers=2, num_heads=4, mlp_dim=64, num_filters=13, k=20,
                             chunk_len=5, delta_pulse=delta_pulse, scan_layers=scan_layers)
  model = family.build(config)
  params = _perturbed(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, config.window_len), jnp.int32)),
                      scale=0.05)
  full = np.random.default_rng(1).integers(0, 48, (2, 20)).astype(np.int32)
  reference = np.asarray(jax.jit(lambda p, x: windowed_logits(model, p["params"], x))(params, full))
  assert_steps_equal(family, model, params, full, reference, np.array([2, 7]), 12)
