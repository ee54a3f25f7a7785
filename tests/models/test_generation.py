"""Cached decoding: every decode step's logits equal a full forward over the same prefix
(transformer and fox, LLaMA and Pro blocks, reference and xla prefill, prompts of different
lengths with segment ids); greedy = repeated argmax; seeded sampling; top-k/top-p sets; one
compilation of the decode loop; early stop; sharded caches; one-line errors; the CLI."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import models
from lpcjax.decoding import GREEDY, GenerationError, Sampling, _decode_jit, generate, sample
from lpcjax.models.decoder import init_cache
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
  sith = models.get("sith")
  with pytest.raises(GenerationError, match="sith family cannot generate text token by token") as error:
    generate(sith, None, None, [[1]], max_new_tokens=1)
  assert "init_cache" not in str(error.value)  # the user's words, not the code's


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
  assert re.fullmatch(r"4 new tokens in [\d.]+ s: [\d.]+ tokens/s \(prefill and compilation included\)", err.strip())
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
