"""Generate text from a trained run: ``python -m lpcjax.generate --run RUN --prompt TEXT``.

  python -m lpcjax.generate --run runs/fox --prompt "It was a dark and stormy night" --max-new-tokens 64
  python -m lpcjax.generate --run runs/fox --prompts prompts.txt --temperature 0.8 --top-p 0.95 --seed 1
  python -m lpcjax.generate --run runs/mqar --token-ids 5,17,3            # runs without a tokenizer

One prompt per line in --prompts FILE (a batch, right-padded). A single prompt is printed, then
its continuation token by token as it is drawn (--no-echo: the continuation only); a batch
prints each row when done, prompt|continuation. The last line, on stderr, gives the new tokens
per second (prefill and compilation included). The tokenizer is the run's GPT-2
tokenizer: --tokenizer-file, else the rank file the run recorded (``data.tokenizer_file``), else
$LPCJAX_TIKTOKEN_FILE, else the GPT-2 rank file lpcjax ships; generation stops at <|endoftext|>
unless --no-stop.

Families that decode: fox, transformer, lpcsm, sith. pmt cannot: it is a time-series encoder,
with no tokens to draw. A family may add flags of its own (its ``Family.stop_rule``: lpcsm's
--stop-head P also ends a row when its stop head says the text ends, off by default);
``--run RUN --help`` lists them. See docs/evaluation.md (Generation).
"""

import argparse
import codecs
import sys
import time

from lpcjax import cli
from lpcjax.errors import warn
from lpcjax.files import check_run_path


class TextStream:
  """Token ids to text as they are drawn. A character can span GPT-2 tokens (curly quotes,
  emoji, CJK), so each token's bytes go through an incremental UTF-8 decoder that holds back an
  unfinished character; ``flush`` ends the stream. The text is then exactly what one
  ``tokenizer.decode`` of all the ids gives (both replace invalid bytes the same way)."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

  def __call__(self, ids):
    tokenizer = self.tokenizer
    data = b"".join(tokenizer.decode_single_token_bytes(t) for t in ids if t < tokenizer.n_vocab)
    return self.utf8.decode(data)

  def flush(self):
    return self.utf8.decode(b"", final=True)


class Echoed:
  """A stream that writes ``prompt_text`` before the text of the first generated token."""

  def __init__(self, stream, prompt_text):
    self.stream, self.prompt_text = stream, prompt_text

  def __call__(self, ids):
    text, self.prompt_text = self.prompt_text + self.stream(ids), ""
    return text


def parse_token_ids(text):
  """'5,17,3' -> [5, 17, 3]; an entry that is no integer is a one-line error naming it."""
  from lpcjax.decoding import GenerationError
  ids = []
  for entry in filter(str.strip, text.split(",")):
    try:
      ids.append(int(entry))
    except ValueError:
      raise GenerationError(f"--token-ids: {entry.strip()!r} is not a token id; expected comma-separated "
                            "integers such as 5,17,3") from None
  return ids


def make_parser(add_help=True):
  parser = argparse.ArgumentParser(description=cli.help_text(__doc__, "python -m lpcjax.generate", "lpcjax-generate"),
                                   add_help=add_help,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--run", required=add_help, help="a run directory (config.json + checkpoints/)")
  prompts = parser.add_mutually_exclusive_group(required=add_help)
  prompts.add_argument("--prompt", help="one prompt (text)")
  prompts.add_argument("--prompts", help="a file of prompts, one per line")
  prompts.add_argument("--token-ids", help="one prompt as comma-separated token ids")
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--max-len", type=int, default=None, help="cache length (default: prompt + new tokens)")
  parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
  parser.add_argument("--top-k", type=int, default=0)
  parser.add_argument("--top-p", type=float, default=1.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  parser.add_argument("--no-stop", action="store_true", help="do not stop at <|endoftext|>")
  parser.add_argument("--no-echo", action="store_true", help="print the continuation only, not the prompt")
  parser.add_argument("--tokenizer-file", default=None,
                      help="tiktoken rank file of the GPT-2 tokenizer, instead of the run's "
                           "recorded one")
  return parser


def parse_args(argv):
  """(the arguments, with the flags of the run's family (``Family.stop_rule``); the run's config,
  read once here). A missing --run, or --help without one, is argparse's usual answer."""
  known, _ = make_parser(add_help=False).parse_known_args(argv)
  parser = make_parser()
  if not known.run:
    return parser.parse_args(argv), None  # argparse's usage or --help, and its exit
  check_run_path(known.run)  # a mistyped path is answered before JAX is imported
  from lpcjax import models
  from lpcjax.runs import read_config
  config = read_config(known.run)
  family = models.get(config.model.family)
  if family.stop_rule is not None:
    family.stop_rule.add_arguments(parser)
  return parser.parse_args(argv), config


def note_past_training_length(run, length):
  """A warning when ``length`` (the longest prompt plus the new tokens) passes the run's training
  length, with what the family was measured to do there (``Family.past_training_length``)."""
  trained = run.config.data.seq_len
  if trained and length > trained:
    measured = (f"what lpcjax measured there for {run.family.name}: {run.family.past_training_length}"
                if run.family.past_training_length else f"lpcjax has not measured {run.family.name} there")
    warn(f"prompt + new tokens = {length} tokens, past the training length of {trained}; {measured}")


def main(argv=None):
  outcome = cli.exit_status(lambda: parse_args(argv))
  if outcome == cli.USAGE_ERROR:  # a run directory that cannot be read
    return outcome
  args, config = outcome
  import flax.linen as nn
  import jax

  from lpcjax.data import load_gpt2_tokenizer
  from lpcjax.decoding import GenerationError, Sampling, TokenPrinter, check_decodes, generate
  from lpcjax.runs import load_run

  def generate_text():
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    run = load_run(args.run, step=args.step, tokenizer_file=args.tokenizer_file, config=config)
    check_decodes(run.family)
    tokenizer = None
    if args.token_ids is not None:
      prompts = [parse_token_ids(args.token_ids)]
    else:
      has_tokenizer = hasattr(run.config.data, "tokenizer_file")
      if not (has_tokenizer or args.tokenizer_file):  # token-id data (mqar): there is no text to encode
        raise GenerationError(f"this run has no tokenizer (data.kind={run.config.data.kind} is token ids, "
                              "not text); give the prompt as --token-ids, e.g. --token-ids 5,17,3")
      # The run's resolved rank file (load_run applied --tokenizer-file); a kind without one
      # (mqar) takes the flag's.
      tokenizer = load_gpt2_tokenizer(run.config.data.tokenizer_file if has_tokenizer else args.tokenizer_file)
      # "" is a prompt too (an error below: it has no tokens), not an absent one
      texts = ([args.prompt] if args.prompt is not None
               else [line.rstrip("\n") for line in open(args.prompts) if line.strip()])
      prompts = [tokenizer.encode_ordinary(text) for text in texts]
    end_token = None if args.no_stop or tokenizer is None else tokenizer.eot_token
    stop_when = None
    if run.family.stop_rule is not None:
      stop_when, end_token = run.family.stop_rule.resolve(run.model, args, end_token)
    vocab = run.config.model.vocab_size
    if any(not 0 <= t < vocab for p in prompts for t in p):
      raise GenerationError(f"prompt token ids must be in [0, {vocab})")
    if all(prompts):  # an empty prompt is an error of generate's, to be said alone
      note_past_training_length(run, max(map(len, prompts)) + args.max_new_tokens)
    if tokenizer:
      decode = lambda ids: tokenizer.decode([t for t in ids if t < tokenizer.n_vocab])
    else:
      decode = lambda ids: "".join(f"{t} " for t in ids)

    stream = TextStream(tokenizer) if tokenizer else decode
    # echoed with the first token, so that a request generate refuses prints nothing
    printer = TokenPrinter(stream if args.no_echo else Echoed(stream, decode(prompts[0])), sys.stdout)
    clock = time.perf_counter()
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
      result = generate(run.family, run.model, run.variables, prompts, max_new_tokens=args.max_new_tokens,
                        max_len=args.max_len, sampling=sampling, seed=args.seed, end_token=end_token,
                        on_token=printer if len(prompts) == 1 else None, stop_when=stop_when)
    return prompts, result, decode, tokenizer, stream, time.perf_counter() - clock, run.step

  # OSError, UnicodeDecodeError: a --prompts file that cannot be read as text
  outcome = cli.exit_status(generate_text, OSError, UnicodeDecodeError)
  if outcome == cli.USAGE_ERROR:
    return outcome
  prompts, result, decode, tokenizer, stream, seconds, step = outcome
  if len(prompts) == 1:
    print(stream.flush() if tokenizer else "")
  else:
    for prompt, tokens in zip(prompts, result.tokens):
      print(f"{decode(prompt)}\u2502{decode(tokens)}")
  new_tokens = sum(map(len, result.tokens))
  hint = undertrained_hint(result.tokens, step)
  if hint:
    print(hint, file=sys.stderr)
  print(f"{new_tokens} new tokens in {seconds:.2f} s: {new_tokens / seconds:.1f} tokens/s (prefill and "
        "compilation included)", file=sys.stderr)
  return 0


def undertrained_hint(rows, step, least=4):
  """A one-line note when every continuation of at least ``least`` tokens repeats one token (a
  model that has learnt only the commonest word: "the the the"), naming the run's step; None
  otherwise. Greedy decoding of a model a few dozen steps old does this: it is not a bug."""
  long_rows = [row for row in rows if len(row) >= least]
  if not long_rows or any(len(set(row)) > 1 for row in long_rows):
    return None
  return (f"note: every continuation repeats one token: a model at step {step} has not learnt enough to "
          "generate text; train it longer (train.steps), or sample (--temperature 0.8)")


def run():
  """The console script ``lpcjax-generate``."""
  cli.finish(main())


if __name__ == "__main__":
  run()
