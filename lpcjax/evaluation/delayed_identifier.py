"""The delayed-identifier probe (LPC-SM, the LPC-SM spec §8.3): does the model carry a key across
a long distractor?

A prompt is a header that introduces an identifier, a long distractor region of real text, and a
trigger prefix after which the identifier must be continued:

    "Record 7. Its identifier is QM-3851." + distractor + " The identifier of record 7 is" + " QM-3851"

scored by the teacher-forced cross-entropy of the identifier's tokens after the trigger ("key
CE", lower is better). The paper's wording, identifier format and reduction were not recovered;
these are chosen here. Each prompt is also scored with a *control* header that names a different
identifier: the control CE is what the model pays without the cue, so key CE below the control
means the header reached the trigger across the distractor. Both are reported as the mean over
prompts of the summed CE of the identifier's tokens (``key_ce``) and per token (``key_ce_per_token``).
"""

import string

import numpy as np

HEADER = "Record {record}. Its identifier is {identifier}.\n\n"
TRIGGER = "\n\nThe identifier of record {record} is"


def random_identifier(rng):
  """'QM-3851': two capitals, a dash, four digits (several GPT-2 tokens, none guessable)."""
  letters = "".join(rng.choice(list(string.ascii_uppercase), 2))
  return f"{letters}-{rng.integers(1000, 10000)}"


def probe_prompts(distractor, tokenizer, prompt_len, count, seed=0):
  """``count`` pairs of (cued, control) examples (tokens [prompt_len] int32, identifier start).

  The two prompts of a pair share the distractor (a random slice of ``distractor``, a token
  array), the record number, the trigger and the scored identifier; only the header's
  identifier differs in the control."""
  rng = np.random.default_rng(seed)
  pairs = []
  for _ in range(count):
    record, identifier, other = int(rng.integers(2, 100)), random_identifier(rng), random_identifier(rng)
    while other == identifier:
      other = random_identifier(rng)
    answer = tokenizer.encode_ordinary(f" {identifier}")
    trigger = tokenizer.encode_ordinary(TRIGGER.format(record=record))
    headers = [tokenizer.encode_ordinary(HEADER.format(record=record, identifier=i)) for i in (identifier, other)]
    pair = []
    for header in headers:
      budget = prompt_len - len(header) - len(trigger) - len(answer)
      if budget < 1 or len(distractor) < budget:
        raise ValueError(f"delayed identifier: a prompt of {prompt_len} tokens needs {max(budget, 1)} distractor "
                         f"tokens (have {len(distractor)})")
      start = int(rng.integers(0, len(distractor) - budget + 1)) if not pair else pair[0][2]
      tokens = header + list(distractor[start:start + budget]) + trigger + answer
      pair.append((np.asarray(tokens, np.int32), prompt_len - len(answer), start))
    pairs.append(tuple((tokens, answer_start) for tokens, answer_start, _ in pair))
  return pairs


def identifier_losses(token_losses_fn, examples):
  """(summed CE, token count) of each example's identifier. ``token_losses_fn(inputs, targets)``
  -> per-position CE [batch, T − 1] for one batch of equal-length examples."""
  tokens = np.stack([t for t, _ in examples])
  losses = np.asarray(token_losses_fn(tokens[:, :-1], tokens[:, 1:]))
  out = []
  for row, (seq, answer_start) in enumerate(examples):
    out.append((float(losses[row, answer_start - 1:].sum()), len(seq) - answer_start))  # t predicts t + 1
  return out


def delayed_identifier_probe(token_losses_fn, distractor, tokenizer, prompt_len=2040, count=6, seed=0):
  """Key CE with the cue and without (control), over ``count`` prompts of ``prompt_len`` tokens."""
  pairs = probe_prompts(distractor, tokenizer, prompt_len, count, seed)
  result = {"prompt_len": prompt_len, "prompts": count}
  for key, column in (("cued", 0), ("control", 1)):
    scored = [identifier_losses(token_losses_fn, [pair[column]])[0] for pair in pairs]
    sums = np.array([s for s, _ in scored])
    tokens = np.array([n for _, n in scored])
    result[key] = {"key_ce": float(sums.mean()), "key_ce_std": float(sums.std()),
                   "key_ce_per_token": float(sums.sum() / tokens.sum()), "per_prompt": sums.tolist()}
  return result
