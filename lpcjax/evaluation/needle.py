"""Needle in a haystack, RULER style, scored offline by exact match (no LLM judge).

A needle sentence "One of the special magic numbers for {key} is: {value}." is inserted at a
depth (fraction of the haystack) into a haystack of real text; the sequence ends with the
question and then the value. Two ways to score, both exact match of every token of the value:
teacher-forced (the argmax at each answer position given the true previous tokens: one parallel
pass) and generated (greedy cached decoding of the answer after the question,
``lpcjax.decoding``). For an exact match of the whole answer the two agree (greedy decoding
reproduces the answer exactly when every teacher-forced argmax does); the generated mode runs
the decoding path end to end, as a user of the model would.
"""

import numpy as np

NEEDLE = " One of the special magic numbers for {key} is: {value}."
QUESTION = (" What is the special magic number for {key} mentioned in the provided text? "
            "The special magic number for {key} mentioned in the provided text is:")
KEYS = ("amber-falcon", "quiet-harbor", "silver-maple", "lucky-comet", "brave-otter", "misty-garden",
        "rapid-willow", "golden-tiger")


def needle_example(haystack, tokenizer, context_len, depth, key, value):
  """(tokens [context_len] int32, needle start, answer start). ``haystack``: a token array
  long enough to fill the context; depth in [0, 1] places the needle that far into it."""
  needle = tokenizer.encode_ordinary(NEEDLE.format(key=key, value=value))
  question = tokenizer.encode_ordinary(QUESTION.format(key=key))
  answer = tokenizer.encode_ordinary(f" {value}")
  budget = context_len - len(needle) - len(question) - len(answer)
  if budget < 0 or len(haystack) < budget:
    raise ValueError(f"needle: a context of {context_len} tokens needs {max(budget, 0)} haystack tokens "
                     f"(have {len(haystack)})")
  position = int(round(depth * budget))
  hay = list(haystack[:budget])
  tokens = hay[:position] + needle + hay[position:] + question + answer
  return np.asarray(tokens, np.int32), position, context_len - len(answer)


def score_answers(predict_fn, examples):
  """Fraction of examples whose answer tokens are all the argmax predictions.

  predict_fn: int32 tokens [batch, T] -> argmax predictions [batch, T] (taken on the device, so
  only the token ids come to the host); examples: (tokens, _, answer_start).
  """
  tokens = np.stack([t for t, _, _ in examples])
  predictions = np.asarray(predict_fn(tokens))
  correct = []
  for row, (seq, _, answer_start) in enumerate(examples):
    predicted = predictions[row, answer_start - 1:len(seq) - 1]  # position t predicts token t+1
    correct.append(bool(np.array_equal(predicted, seq[answer_start:])))
  return float(np.mean(correct))


def score_generated(generate_fn, examples):
  """Fraction of examples whose greedily generated answer equals the value's tokens.

  generate_fn(prompts, max_new_tokens) -> generated token lists; the prompt is everything
  before the answer."""
  answers = [seq[answer_start:] for seq, _, answer_start in examples]
  generated = generate_fn([seq[:answer_start].tolist() for seq, _, answer_start in examples],
                          max(len(a) for a in answers))
  return float(np.mean([list(g[:len(a)]) == a.tolist() for g, a in zip(generated, answers)]))


def needle_grid(predict_fn, haystack, tokenizer, lengths, depths, trials=3, seed=0, score=None):
  """Accuracy [len(depths), len(lengths)]: each cell averages ``trials`` key/value pairs.
  ``score(examples)`` defaults to the teacher-forced ``score_answers(predict_fn, examples)``."""
  score = score or (lambda examples: score_answers(predict_fn, examples))
  rng = np.random.default_rng(seed)
  grid = np.zeros((len(depths), len(lengths)))
  for j, length in enumerate(lengths):
    examples, cells = [], []
    for i, depth in enumerate(depths):
      for _ in range(trials):
        key = KEYS[rng.integers(len(KEYS))]
        value = str(rng.integers(1_000_000, 10_000_000))
        examples.append(needle_example(haystack, tokenizer, length, depth, key, value))
        cells.append(i)
    for i in range(len(depths)):  # one batch per (length, depth): one compiled shape per length
      grid[i, j] = score([e for e, c in zip(examples, cells) if c == i])
  return grid
