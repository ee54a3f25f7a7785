"""The generated tasks of the mechanism suite: every answer checked against a direct reading of
the example (not the generator's own bookkeeping), determinism by (seed, split, index), one-line
config errors."""

import numpy as np
import pytest

from lpcjax.config import ConfigError
from lpcjax.data import (DelayedIdConfig, FuzzyRecallConfig, MQARDataConfig, NoisyRecallConfig, OverwriteConfig,
                         SelectiveCopyConfig, make_dataset, make_iterator, make_source)

CONFIGS = [
    MQARDataConfig(seq_len=64, batch_size=4, mqar_vocab_size=64, mqar_num_pairs=6, mqar_filler="random"),
    OverwriteConfig(seq_len=64, batch_size=4, task_vocab_size=64, overwrite_num_keys=4),
    DelayedIdConfig(seq_len=64, batch_size=4, task_vocab_size=64, delayed_id_max_ids=6, delayed_id_gap=30),
    NoisyRecallConfig(seq_len=64, batch_size=4, task_vocab_size=64, noisy_num_keys=4, noisy_noise_fraction=0.3),
    FuzzyRecallConfig(seq_len=63, batch_size=4, task_vocab_size=64, fuzzy_num_keys=4, fuzzy_key_len=3),
    SelectiveCopyConfig(seq_len=64, batch_size=4, task_vocab_size=64, copy_num_tokens=8),
]


def examples(cfg, count=20, split="train"):
  source = make_source(cfg, 3, split)
  for i in range(count):
    e = source[i]
    yield e["inputs"], e["targets"], np.flatnonzero(e["loss_mask"]), e["answer_bucket"]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_examples_depend_only_on_seed_split_and_index(cfg):
  a, again = make_source(cfg, 1, "train")[7], make_source(cfg, 1, "train")[7]
  for key in a:
    np.testing.assert_array_equal(a[key], again[key])
  np.testing.assert_array_equal(a["inputs"][1:], a["targets"][:-1])
  for other in (make_source(cfg, 1, "train")[8], make_source(cfg, 1, "eval")[7], make_source(cfg, 1, "test")[7],
                make_source(cfg, 2, "train")[7]):
    assert not np.array_equal(a["inputs"], other["inputs"])
  assert a["inputs"].shape == a["answer_bucket"].shape == (cfg.seq_len,)
  assert a["inputs"].max() < cfg.vocab_size and a["inputs"].min() >= 0
  answers = a["loss_mask"] > 0
  assert answers.any() and (a["answer_bucket"][answers] >= 1).all() and (a["answer_bucket"][~answers] == -1).all()
  batch = next(make_iterator(make_dataset(cfg, 0, "test", max_examples=4)))
  assert batch["answer_bucket"].shape == (4, cfg.seq_len)


def test_mqar_random_filler_never_shows_a_key_between_its_pairs_and_queries():
  cfg = CONFIGS[0]
  for inputs, targets, answers, buckets in examples(cfg):
    keys = set(inputs[0:12:2].tolist())
    others = np.ones(cfg.seq_len, bool)
    others[:12] = False
    others[answers] = others[answers + 1] = False
    assert not keys & set(inputs[others].tolist()) and (inputs[others] != 0).mean() > 0.9
    for t, bucket in zip(answers, buckets[answers]):
      key_position = int(np.flatnonzero(inputs == inputs[t])[0])
      assert targets[t] == inputs[key_position + 1] and bucket <= t - key_position < 2 * bucket


def test_mqar_zero_filler_examples_are_unchanged_by_the_new_fields():
  cfg = MQARDataConfig(seq_len=64, batch_size=4, mqar_vocab_size=64, mqar_num_pairs=6)
  example = make_source(cfg, 0, "train")[2]
  from lpcjax.data import mqar_example
  tokens, mask = mqar_example(np.random.default_rng([0, 0, 2]), 64, 64, 6, 0.1)
  np.testing.assert_array_equal(example["inputs"], tokens[:-1])
  np.testing.assert_array_equal(example["loss_mask"], mask)


def test_overwrite_answer_is_the_latest_value_written():
  cfg = CONFIGS[1]
  for inputs, targets, answers, buckets in examples(cfg):
    assert len(answers) == 4 and answers[0] == cfg.seq_len + 1 - 8
    for t in answers:
      writes = [p for p in range(0, answers[0] - 1) if inputs[p] == inputs[t] and inputs[p] < 32]
      latest = max(writes)
      assert targets[t] == inputs[latest + 1]
      assert buckets[t] <= len(writes) < 2 * buckets[t]
    # the task is not trivial: some key held another value before its latest one
  seen_overwritten = any(
      len({int(inputs[p + 1]) for p in range(0, answers[0] - 1, 1) if inputs[p] == inputs[t]}) > 1
      for inputs, _, answers, _ in examples(cfg) for t in answers)
  assert seen_overwritten


def test_delayed_id_recalls_the_identifiers_after_the_gap():
  cfg = CONFIGS[2]
  counts = set()
  for inputs, targets, answers, buckets in examples(cfg, 40):
    k = len(answers)
    counts.add(k)
    tokens = np.append(inputs, targets[-1])
    assert list(answers) == list(range(cfg.seq_len - k, cfg.seq_len)) and tokens[cfg.seq_len - k] == 1
    ids = tokens[-k:]
    first = cfg.seq_len + 1 - k - 1 - cfg.delayed_id_gap - k
    np.testing.assert_array_equal(tokens[first:first + k], ids)
    assert (ids >= 32).all() and len(set(ids.tolist())) == k and (buckets[answers] == k).all()
    others = np.ones(len(tokens), bool)
    others[first:first + k] = others[-k - 1:] = False
    assert (tokens[others] >= 2).all() and (tokens[others] < 32).all()  # distractor only
  assert counts == set(range(1, 7))


def test_delayed_id_repeat_writes_each_identifier_in_a_run_and_recalls_it_once():
  cfg = DelayedIdConfig(seq_len=64, batch_size=4, task_vocab_size=64, delayed_id_max_ids=3, delayed_id_gap=20,
                        delayed_id_repeat=4)
  for inputs, targets, answers, _ in examples(cfg, 20):
    k = len(answers)
    tokens = np.append(inputs, targets[-1])
    ids = tokens[-k:]
    first = cfg.seq_len + 1 - k - 1 - 20 - 4 * k
    np.testing.assert_array_equal(tokens[first:first + 4 * k], np.repeat(ids, 4))
    assert (tokens[:first] < 32).all() and (tokens[first + 4 * k:-k - 1] < 32).all()


def _dictionary_reading(inputs, targets, key_len, value_len, is_key):
  """Positions predicting a value token of an entry seen before, read by scanning the tokens."""
  tokens = np.append(inputs, targets[-1])
  expected, seen, p = [], {}, 0
  while p < len(tokens):
    if not is_key(tokens[p]):
      p += 1
      continue
    key = tuple(tokens[p:p + key_len])
    value = tuple(tokens[p + key_len:p + key_len + value_len])
    if key in seen:
      assert seen[key] == value
      expected += range(p + key_len - 1, p + key_len + value_len - 1)
    seen[key] = value
    p += key_len + value_len
  return expected


def test_noisy_recall_scores_values_of_repeated_keys_among_noise():
  cfg = CONFIGS[3]
  for inputs, targets, answers, _ in examples(cfg):
    expected = _dictionary_reading(inputs, targets, 1, 1, lambda token: 16 <= token < 32)
    assert list(answers) == expected
    assert abs((inputs < 16).mean() - 0.3) < 0.1  # the noise fraction


def test_fuzzy_recall_scores_every_value_token_of_repeated_keys():
  cfg = CONFIGS[4]
  for inputs, targets, answers, _ in examples(cfg):
    tokens = np.append(inputs, targets[-1])
    start = int(np.flatnonzero(tokens)[0])  # left padding
    assert start == (cfg.seq_len + 1) % 5
    expected, seen = [], {}
    for p in range(start, len(tokens), 5):
      key, value = tuple(tokens[p:p + 3]), tuple(tokens[p + 3:p + 5])
      if key in seen:
        expected += [p + 2, p + 3]
      seen[key] = value
    assert list(answers) == expected


def test_selective_copy_outputs_the_content_in_order():
  cfg = CONFIGS[5]
  for inputs, targets, answers, buckets in examples(cfg):
    context = inputs[:cfg.seq_len - 8]
    content = context[context != 0]
    assert len(content) == 8 and inputs[cfg.seq_len - 8] == 1
    np.testing.assert_array_equal(targets[answers], content)
    assert list(buckets[answers]) == [1, 2, 2, 4, 4, 4, 4, 8]


@pytest.mark.parametrize("make,field", [
    (lambda: OverwriteConfig(seq_len=16, overwrite_num_keys=8), "data.overwrite_num_keys"),
    (lambda: DelayedIdConfig(seq_len=32, delayed_id_max_ids=8, delayed_id_gap=20), "data.delayed_id_gap"),
    (lambda: DelayedIdConfig(seq_len=64, delayed_id_min_ids=5, delayed_id_max_ids=4), "data.delayed_id_min_ids"),
    (lambda: DelayedIdConfig(seq_len=64, delayed_id_max_ids=4, delayed_id_gap=45, delayed_id_repeat=4),
     "data.delayed_id_gap"),
    (lambda: DelayedIdConfig(seq_len=64, delayed_id_repeat=0), "data.delayed_id_repeat"),
    (lambda: DelayedIdConfig(seq_len=64, task_vocab_size=16, delayed_id_max_ids=8), "data.task_vocab_size"),
    (lambda: NoisyRecallConfig(noisy_noise_fraction=1.0), "data.noisy_noise_fraction"),
    (lambda: FuzzyRecallConfig(seq_len=8, fuzzy_key_len=3, fuzzy_value_len=3), "data.seq_len"),
    (lambda: SelectiveCopyConfig(seq_len=16, copy_num_tokens=8), "data.copy_num_tokens"),
    (lambda: MQARDataConfig(mqar_filler="noise"), "data.mqar_filler"),
])
def test_impossible_tasks_are_one_line_errors(make, field):
  with pytest.raises(ConfigError, match=field) as error:
    make()
  assert "\n" not in str(error.value)


def test_generated_data_has_no_other_split():
  with pytest.raises(ValueError, match="splits"):
    make_source(CONFIGS[1], 0, "validation")
