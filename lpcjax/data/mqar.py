"""Multi-query associative recall (MQAR, Zoology): the built-in long-context task.

Each example starts with ``num_pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys unique, drawn
from [1, V/2); values from [V/2, V)). The rest of the sequence is filler token 0, except that
every key appears once more later as a query, followed by its value. The model is scored only
where the next token is a queried value, so it must recall a pair seen up to seq_len tokens
earlier. Query gaps are power-law: slot s after the pairs has weight (s + 1)^(power - 1).

Our choice where Zoology leaves room: filler is token 0 rather than random tokens, so the only
signal is the pairs; every key is queried exactly once.
"""

import numpy as np


def mqar_example(rng, seq_len, vocab_size, num_pairs, gap_power):
  """One example: tokens [seq_len + 1] (inputs = tokens[:-1], targets = tokens[1:]) and the
  loss mask [seq_len] (1 where the target is a queried value)."""
  half = vocab_size // 2
  keys = rng.choice(np.arange(1, half), size=num_pairs, replace=False)
  values = rng.integers(half, vocab_size, size=num_pairs)
  tokens = np.zeros(seq_len + 1, dtype=np.int32)
  pair_len = 2 * num_pairs
  tokens[0:pair_len:2] = keys
  tokens[1:pair_len:2] = values
  num_slots = (seq_len + 1 - pair_len) // 2
  weights = (np.arange(num_slots) + 1.0) ** (gap_power - 1.0)
  slots = rng.choice(num_slots, size=num_pairs, replace=False, p=weights / weights.sum())
  order = rng.permutation(num_pairs)
  query_pos = pair_len + 2 * slots
  tokens[query_pos] = keys[order]
  tokens[query_pos + 1] = values[order]
  loss_mask = np.zeros(seq_len, dtype=np.float32)
  loss_mask[query_pos] = 1.0
  return tokens, loss_mask
