"""The evaluator of the language-model families: per-token loss curve, perplexity by context
length, needle in a haystack, MQAR recall by distance, and their plots."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpcjax.data import (DataError, TextDataConfig, TokenFileConfig, TooShortError, load_gpt2_tokenizer,
                         make_dataset, tokenize_files)
from lpcjax.config import switch_class
from lpcjax.files import write_json_atomic
from lpcjax.layers.common import num_params
from lpcjax.decoding import generate

from .delayed_identifier import delayed_identifier_probe
from .needle import needle_grid, score_generated
from .per_token import confidence_band, per_token_losses, sequence_logits, summarize
from .plots import plot_answers, plot_needle, plot_per_token, plot_perplexity
from .recall import answer_accuracy

NEEDLE_DEPTHS = tuple(i / 10 for i in range(11))


def _eval_data(config, eval_len, batch_size, data_files, data_tokens):
  """The data config for evaluation: the run's own eval data unless --data files or --tokens
  name other data (as a text or token-file kind, with the run's options carried over)."""
  data = config.data
  if data_files:
    data = dataclasses.replace(switch_class(data, TextDataConfig), train_files=tuple(data_files),
                               eval_files=tuple(data_files))
  elif data_tokens:
    data = dataclasses.replace(switch_class(data, TokenFileConfig), train_tokens=data_tokens, eval_tokens=data_tokens)
  data = data.for_evaluation(eval_len, batch_size)
  if data.vocab_size > config.model.vocab_size:
    raise DataError(f"tokenizer mismatch: the run's model has {config.model.vocab_size} tokens, "
                    f"the {data.kind} data {data.vocab_size}")
  data.check_tokenizer()
  return data


def _text_tokens(files, data_config, tokenizer, what):
  """Tokens of ``files`` if given, else of the run's own eval (or training) text."""
  tokens = tokenize_files(files, tokenizer)[0] if files else data_config.text_tokens(tokenizer)
  if tokens is None:
    raise DataError(f"{what} needs text: give --haystack FILE ... (or --data)")
  return tokens


def _probe_tokenizer(data_config, options, vocab_size):
  """The GPT-2 tokenizer of the text probes (--needle, --delayed-id): the run's (with eval.py's
  --tokenizer-file applied), or for a data kind without one (mqar) the --tokenizer-file given;
  a model whose vocabulary cannot hold GPT-2's ids is refused (they would index past its
  embedding, and the probe score nothing)."""
  given = getattr(options, "tokenizer_file", None)  # eval.py's flag; absent from evaluator_options
  if hasattr(data_config, "tokenizer_file"):
    rank_file = data_config.tokenizer_file
  elif given:
    rank_file = given
  else:
    raise DataError(f"--needle/--delayed-id: this run has no tokenizer (data.kind={data_config.kind} is token "
                    "ids, not text); the probes need a GPT-2 text model (or pass --tokenizer-file FILE)")
  tokenizer = load_gpt2_tokenizer(rank_file)
  if tokenizer.n_vocab > vocab_size:
    raise DataError(f"--needle/--delayed-id: the model has {vocab_size} tokens, fewer than the GPT-2 "
                    f"tokenizer's {tokenizer.n_vocab}: its ids would be out of range")
  return tokenizer


def _token_losses(model, params, sequence_logits):
  """(inputs, targets) [batch, T] -> per-position cross-entropy [batch, T] as numpy."""
  losses = jax.jit(lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(sequence_logits(model, p, x), y))
  return lambda inputs, targets: np.asarray(losses(params, inputs, targets))


def run_label(config, params, run_dir=None):
  """'NAME (family, architecture, size)': NAME, the run directory's, tells apart two runs of one
  model (the architecture alone read the same twice in a comparison)."""
  describe = getattr(config.model, "describe", None)
  size = f"{describe()}, " if describe else ""
  size += f"{num_params(params) / 1e6:.1f}M"
  if not run_dir:
    return f"{config.model.family} ({size})"
  return f"{os.path.basename(os.path.normpath(run_dir))} ({config.model.family}, {size})"


def distinct_labels(results):
  """Runs in different folders of one name (a/fox, b/fox): their labels get the parent folder
  too, so that the legend, the console and compare.json still tell them apart."""
  labels = [r["label"] for r in results]
  for r in results:
    if labels.count(r["label"]) > 1:
      path = os.path.normpath(r["run"])
      name, parent = os.path.basename(path), os.path.basename(os.path.dirname(path))
      r["label"] = r["label"].replace(name, f"{parent}/{name}", 1)


class LanguageModelEvaluator:
  """eval.py for models that map tokens [batch, T] to next-token logits.

  ``sequence_logits(model, params, inputs, segment_ids)`` gives the logits at every position of
  a long sequence (default: the model's forward pass; ``sith`` slides its windows).
  """

  def __init__(self, sequence_logits=sequence_logits):
    self.sequence_logits = sequence_logits

  def add_arguments(self, parser):
    parser.add_argument("--data", nargs="+", help="text files to evaluate on (default: the run's eval data)")
    parser.add_argument("--tokens", help="a prepared token file prefix to evaluate on")
    parser.add_argument("--eval-len", type=int, default=None, help="default: 4x the training length")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--max-sequences", type=int, default=None,
                        help="default: every sequence of the data (generated MQAR: 1024)")
    parser.add_argument("--no-roll", action="store_true", help="do not roll sequences randomly")
    parser.add_argument("--needle", action="store_true", help="run the needle-in-a-haystack grid")
    parser.add_argument("--needle-lengths", type=int, nargs="+", default=None)
    parser.add_argument("--needle-mode", choices=("teacher", "generate", "both"), default="teacher",
                        help="score the answer teacher-forced, by greedy cached decoding, or both")
    parser.add_argument("--haystack", nargs="+", default=None,
                        help="haystack / distractor text files (default: --data, else the run's eval data)")
    parser.add_argument("--delayed-id", action="store_true",
                        help="run the delayed-identifier probe (key cross-entropy after a long distractor)")
    parser.add_argument("--delayed-id-len", type=int, default=2040, help="tokens per probe prompt (paper: 2040)")
    parser.add_argument("--delayed-id-prompts", type=int, default=6, help="probe prompts (paper: 6)")
    parser.add_argument("--per-token", action="store_true",
                        help="with --needle/--delayed-id: the per-token curve too (default: the "
                             "probes alone, leaving per_token.json as it is)")
    parser.add_argument("--split", choices=("eval", "test"), default="eval",
                        help="generated data (MQAR, the mechanism tasks): score the held-out split the "
                             "trainer evaluated on, or the test split that neither training nor the "
                             "choice of learning rate saw")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rolls and the needle keys")
    parser.add_argument("--window", type=int, default=64,
                        help="positions per moving-average window and per confidence-band bin")
    parser.add_argument("--log-x", action="store_true")
    parser.add_argument("--no-progress", dest="progress", action="store_false")

  def evaluate(self, run, options):
    """Everything eval.py reports for one run (a LoadedRun), as a JSON-ready dict."""
    config, mesh, seed = run.config, run.mesh, options.seed
    split = getattr(options, "split", "eval")
    if split != "eval" and (options.data or options.tokens or not config.data.scores_answers):
      raise DataError(f"--split {split}: only generated data kinds (MQAR, the mechanism tasks) have one; "
                      "text and token files are scored on their eval data")
    eval_len, batch_size, data = options.eval_len, options.batch_size, options.data
    train_len = config.data.seq_len
    eval_len = eval_len or 4 * train_len
    data_ways = mesh.shape["data"] * mesh.shape["fsdp"]
    batch_size = batch_size or data_ways
    if batch_size % data_ways:
      raise DataError(f"--batch-size {batch_size} is not divisible by the {data_ways} data devices")
    data_config = _eval_data(config, eval_len, batch_size, data, options.tokens)
    max_sequences = options.max_sequences
    if max_sequences is None:
      max_sequences = data_config.default_eval_examples
    # A probe flag runs that probe alone: the per-token pass over the data takes minutes and its
    # results stay as they are (per_token.json is not rewritten); --per-token runs both.
    probes_only = (options.needle or options.delayed_id) and not options.per_token
    label = run_label(config, run.params, run.run_dir)
    with jax.set_mesh(mesh), nn.logical_axis_rules(run.rules):
      # argmax on the device, one jitted function for the answers and the needle grid
      predict = jax.jit(lambda p, x: jnp.argmax(self.sequence_logits(run.model, p, x), axis=-1))
      predict_fn = lambda x: predict(run.params, np.asarray(x))
      result = {"probes_only": True} if probes_only else self._per_token(run, options, data_config,
                                                                          max_sequences, predict_fn)
      result.update(run=os.path.abspath(run.run_dir), label=label, train_len=train_len,
                    family=config.model.family, data_kind=data_config.kind,
                    eval_data=data_config.evaluation_data() if split == "eval" else
                    f"generated {data_config.kind} examples of the {split} split")
      tokenizer = None
      if options.needle or options.delayed_id:
        tokenizer = _probe_tokenizer(data_config, options, config.model.vocab_size)
        hay = _text_tokens(options.haystack or data, data_config, tokenizer, "--needle/--delayed-id")
      if options.delayed_id:
        token_losses = _token_losses(run.model, run.params, self.sequence_logits)
        result["delayed_identifier"] = delayed_identifier_probe(
            token_losses, hay, tokenizer, options.delayed_id_len, options.delayed_id_prompts, seed)
      if options.needle:
        lengths = options.needle_lengths or [n for n in (1024 * 2**k for k in range(10)) if n <= eval_len] or [eval_len]
        modes = ("teacher", "generate") if options.needle_mode == "both" else (options.needle_mode,)
        for mode in modes:
          score = None if mode == "teacher" else lambda examples: score_generated(
              lambda prompts, n: generate(run.family, run.model, {"params": run.params}, prompts,
                                          max_new_tokens=n).tokens, examples)
          grid = needle_grid(predict_fn, hay, tokenizer, lengths, NEEDLE_DEPTHS, seed=seed, score=score)
          key = "needle" if mode == "teacher" else "needle_generated"
          result[key] = {"lengths": list(lengths), "depths": list(NEEDLE_DEPTHS), "accuracy": grid.tolist()}
    return result

  def _per_token(self, run, options, data_config, max_sequences, predict_fn):
    """The per-token loss curve and its summaries over the evaluation data (MQAR: recall too)."""
    seed, split = options.seed, getattr(options, "split", "eval")
    if max_sequences is not None and max_sequences < 1:
      raise DataError(f"--max-sequences: must be >= 1, got {max_sequences} (leave it out to score every sequence)")
    try:
      dataset = make_dataset(data_config, seed, split, max_examples=max_sequences)
    except TooShortError as error:  # the evaluation length, not the data, is what the user can change
      raise DataError(f"{error}; the evaluation length is {data_config.seq_len} (--eval-len, default 4x the "
                      f"training length): pass --eval-len {error.num_tokens - 1} or less, or more text") from None
    roll = not options.no_roll and data_config.is_text_stream
    batches = lambda: (dataset[i] for i in range(len(dataset)))
    totals = per_token_losses(run.model, run.params, batches(), run.mesh,
                              logits_fn=self.sequence_logits, roll_seed=seed if roll else None,
                              progress=options.progress, total=len(dataset), bin_width=options.window)
    result = summarize(totals.sums, totals.counts, len(totals.sequence_means),
                       data_config.tokens_per_word())
    result.update(rolled=roll, per_sequence_loss=totals.sequence_means.tolist(),
                  band=confidence_band(totals))
    if data_config.scores_answers:
      answers = answer_accuracy(predict_fn, batches())
      result["answers"] = {**answers, "chance": data_config.chance, "bucket_name": data_config.answer_bucket_name,
                           "split": split, "eval_len": data_config.seq_len}
      if data_config.scores_recall:
        result["recall_by_distance"] = answers["by_bucket"]
    return result

  def write(self, results, out_dir, options):
    """per_token.json (compare.json for several runs), written atomically, and the PNG plots;
    probes alone (a probe flag without --per-token) go to probes.json (compare_probes.json)."""
    probes_only = any(r.get("probes_only") for r in results)
    name = "per_token.json" if len(results) == 1 else "compare.json"
    if probes_only:
      name = "probes.json" if len(results) == 1 else "compare_probes.json"
    distinct_labels(results)
    write_json_atomic(os.path.join(out_dir, name), results if len(results) > 1 else results[0])
    runs = [(r["label"], r, r["train_len"]) for r in results]
    if not probes_only:
      self._plot_curves(runs, out_dir, options)
    for r in results:
      for key, how in (("needle", "teacher-forced"), ("needle_generated", "generated")):
        if key in r:
          suffix = "" if len(results) == 1 else "_" + os.path.basename(r["run"].rstrip("/"))
          plot_needle(np.array(r[key]["accuracy"]), r[key]["lengths"], r[key]["depths"],
                      os.path.join(out_dir, f"{key}{suffix}.png"), title=f"Needle in a haystack ({how}): {r['label']}")

  def _plot_curves(self, runs, out_dir, options):
    plot_per_token(runs, os.path.join(out_dir, "per_token_loss.png"), window=options.window, log_x=options.log_x)
    plot_perplexity(runs, os.path.join(out_dir, "perplexity_vs_context.png"))
    if all("recall_by_distance" in r for _, r, _ in runs):
      plot_answers(runs, os.path.join(out_dir, "recall_by_distance.png"))
    elif all("answers" in r for _, r, _ in runs):
      plot_answers(runs, os.path.join(out_dir, "accuracy_by_bucket.png"))

  def report(self, result):
    """Lines for the terminal."""
    if result.get("probes_only"):
      lines = [f"{result['label']}: probes only (--per-token adds the per-token curve)"]
      return lines + self._probe_lines(result)
    by_length = ", ".join(f"L={k}: {v['loss']:.3f}" for k, v in result["by_context_length"].items()
                          if v["loss"] is not None)
    word = f", word perplexity {result['word_perplexity']:.1f}" if result.get("word_perplexity") else ""
    lines = [f"{result['label']}: mean loss {result['mean_loss']:.4f}, perplexity {result['perplexity']:.2f}"
             f"{word} over {result['num_sequences']} sequences",
             *([f"  scored on {result['eval_data']}"] if result.get("eval_data") else []),
             f"  mean loss over the first L tokens: {by_length}"]
    lines += self._probe_lines(result)
    if "answers" in result:
      answers = result["answers"]
      lines.append(f"  accuracy at the answers ({answers['split']} split): {answers['accuracy']:.1%} of "
                   f"{answers['count']} (chance {answers['chance']:.1%}); by {answers['bucket_name']}: " + ", ".join(
                       f"{bucket}: {cell['accuracy']:.1%} (n={cell['count']})"
                       for bucket, cell in answers["by_bucket"].items()))
    return lines

  def _probe_lines(self, result):
    lines = []
    if "delayed_identifier" in result:
      probe = result["delayed_identifier"]
      lines.append(f"  delayed identifier ({probe['prompts']} prompts of {probe['prompt_len']} tokens): key CE "
                   f"{probe['cued']['key_ce']:.3f} ± {probe['cued']['key_ce_std']:.3f} "
                   f"(control, header names another id: {probe['control']['key_ce']:.3f})")
    for key, how in (("needle", "teacher-forced"), ("needle_generated", "generated")):
      if key in result:
        accuracy = float(np.mean(result[key]["accuracy"]))
        lines.append(f"  needle in a haystack ({how}): mean exact-match accuracy {accuracy:.1%}")
    return lines

