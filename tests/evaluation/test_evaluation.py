import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpcjax import models
from lpcjax.data import DataError, load_gpt2_tokenizer
from lpcjax.evaluation import (LanguageModelEvaluator, context_lengths, needle_example, needle_grid, per_token_losses,
                               recall_by_distance, score_answers, score_generated, summarize)
from lpcjax.runs import RunError, evaluate_run, evaluator_options, load_run
from lpcjax.evaluation.per_token import confidence_band, roll_batch
from lpcjax.sharding import make_mesh
from lpcjax.training import train

from conftest import REPO, TEXT, cli, ctrl_c_swallowed_by_the_interpreter, tiny_experiment, write_token_file


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  out = {}
  for family in ("fox", "transformer"):
    cfg = tiny_experiment(root, f"model.family={family}", "train.steps=4", "train.warmup_steps=1",
                          "train.mesh_data=1", "data.seq_len=16", name=family)
    out[family], _ = train(cfg, progress=False, devices=jax.devices()[:1])
  return out


def test_per_token_curve_equals_direct_computation():
  cfg = models.FoXConfig(vocab_size=40, d_model=32, num_layers=1, num_heads=2, mlp_multiple_of=32)
  model = models.get("fox").build(cfg)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 12), jnp.int32))["params"]
  rng = np.random.default_rng(0)
  batches = [{"inputs": rng.integers(0, 40, (2, 12)).astype(np.int32),
              "targets": rng.integers(0, 40, (2, 12)).astype(np.int32),
              "loss_mask": (rng.uniform(size=(2, 12)) > 0.2).astype(np.float32)} for _ in range(3)]
  mesh = make_mesh(tiny_experiment("/tmp", "train.mesh_data=1").train, jax.devices()[:1])
  batches[1]["valid"] = np.array([1.0, 0.0], np.float32)  # a padding row: counted nowhere
  totals = per_token_losses(model, params, batches, mesh, progress=False, bin_width=5)
  result = summarize(totals.sums, totals.counts, len(totals.sequence_means))
  direct_sum, direct_count, bin_sums, bin_counts = np.zeros(12), np.zeros(12), [], []
  for batch in batches:
    for row in range(2):
      if batch.get("valid", np.ones(2))[row] == 0:
        continue
      logits = np.asarray(model.apply({"params": params}, batch["inputs"][row:row + 1])[0], np.float64)
      log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
      loss = (log_z - logits[np.arange(12), batch["targets"][row]]) * batch["loss_mask"][row]
      direct_sum += loss
      direct_count += batch["loss_mask"][row]
      bin_sums.append([loss[a:a + 5].sum() for a in (0, 5, 10)])
      bin_counts.append([batch["loss_mask"][row][a:a + 5].sum() for a in (0, 5, 10)])
  np.testing.assert_allclose(result["per_token_loss"], direct_sum / direct_count, atol=1e-5)
  assert result["mean_loss"] == pytest.approx(direct_sum.sum() / direct_count.sum(), abs=1e-6)
  assert result["num_sequences"] == 5 and result["per_token_count"] == direct_count.tolist()
  bin_sums, bin_counts = np.array(bin_sums), np.array(bin_counts)  # bins of 5, 5 and 2 positions
  np.testing.assert_allclose(totals.bin_sums, bin_sums, atol=1e-5)
  np.testing.assert_array_equal(totals.bin_counts, bin_counts)
  band = confidence_band(totals)
  ratio = bin_sums.sum(0) / bin_counts.sum(0)  # the curve's own value over each bin
  np.testing.assert_allclose(band["mean"], ratio, atol=1e-6)
  n = (bin_counts > 0).sum(0)
  spread = np.sqrt(((bin_sums - ratio * bin_counts) ** 2).sum(0) / (n * (n - 1))) / bin_counts.mean(0)
  np.testing.assert_allclose(band["stderr"], spread, atol=1e-6)
  assert band["centers"] == [3.0, 8.0, 11.5] and band["sequences"] == n.tolist()
  assert context_lengths(12) == [2, 4, 8, 12] and context_lengths(3000) == [512, 1024, 2048, 3000]
  assert context_lengths(256) == [32, 64, 128, 256] and context_lengths(8192)[:2] == [512, 1024]


def test_roll_moves_inputs_targets_and_mask_together():
  batch = {"inputs": np.arange(10).reshape(2, 5), "targets": np.arange(10).reshape(2, 5) + 1,
           "loss_mask": np.array([[1, 0, 0, 1, 0], [0, 1, 1, 0, 0]], np.float32)}
  rolled = roll_batch(batch, np.random.default_rng(4))
  np.testing.assert_array_equal(rolled["targets"] - rolled["inputs"], np.ones((2, 5)))
  for row in range(2):
    shift = int(np.flatnonzero(rolled["inputs"][row] == batch["inputs"][row, 0])[0])
    assert shift != 0  # seed 4 rolls the rows by 3 and 4
    np.testing.assert_array_equal(rolled["inputs"][row], np.roll(batch["inputs"][row], shift))
    np.testing.assert_array_equal(rolled["loss_mask"][row], np.roll(batch["loss_mask"][row], shift))


@pytest.mark.parametrize("family", ["fox", "transformer"])
def test_eval_at_four_times_the_training_length_compiles_once(runs, family, tmp_path, no_persistent_cache):
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, duration, **kw: compiles.append(event) if event.endswith("backend_compile_duration") else None)
  ways = len(jax.devices())  # the default eval mesh puts every device on the data axis

  def compilations(**options):
    before = len(compiles)
    result = evaluate_run(runs[family], progress=False, **options)
    return len(compiles) - before, result

  compilations(max_sequences=ways)  # warms the caches shared by every evaluation (restore, ...)
  one_batch, result = compilations(max_sequences=ways)
  three_batches, _ = compilations(max_sequences=3 * ways)
  assert one_batch >= 1  # the listener sees compilations at all
  assert three_batches == one_batch  # exactly the same compilations, whatever the number of batches
  assert result["eval_len"] == 64 and result["train_len"] == 16 and len(result["per_token_loss"]) == 64
  assert result["num_sequences"] == ways and set(result["recall_by_distance"])
  LanguageModelEvaluator().write([result], str(tmp_path), evaluator_options(LanguageModelEvaluator()))
  assert (tmp_path / "per_token_loss.png").stat().st_size > 1000
  assert (tmp_path / "recall_by_distance.png").stat().st_size > 1000


def test_compare_overlays_runs(runs, tmp_path):
  results = [evaluate_run(runs[f], max_sequences=2, progress=False) for f in ("fox", "transformer")]
  LanguageModelEvaluator().write(results, str(tmp_path), evaluator_options(LanguageModelEvaluator()))
  saved = json.load(open(tmp_path / "compare.json"))
  assert [r["family"] for r in saved] == ["fox", "transformer"]
  assert (tmp_path / "perplexity_vs_context.png").exists()


def test_eval_reads_each_config_json_once(runs, tmp_path, monkeypatch):
  """eval.py --compare parses each run's config.json once: its evaluator and its load share it."""
  from lpcjax import experiment
  parsed = []
  from_dict = experiment.from_dict
  monkeypatch.setattr(experiment, "from_dict", lambda values: parsed.append(values) or from_dict(values))
  argv = ["--compare", runs["fox"], runs["transformer"], "--out", str(tmp_path), "--max-sequences", "1"]
  assert cli("eval")(argv) == 0
  assert len(parsed) == 2


def test_compared_runs_of_one_model_are_told_apart_and_keep_the_evaluated_x_axis(runs, tmp_path,
                                                                                  monkeypatch):
  """Two runs of the same model (here: copies of one run, in folders 'fox' and 'b/fox') get
  different labels in compare.json, the legend and the console; a run that claims a 16k training
  length (a converted run) does not stretch the x-axis past the evaluated 64 positions."""
  import shutil
  from lpcjax.evaluation import plots
  copies = [tmp_path / "a" / "fox", tmp_path / "b" / "fox", tmp_path / "fox_again"]
  for copy in copies:
    shutil.copytree(runs["fox"], copy)
  results = [evaluate_run(str(c), max_sequences=2, eval_len=64, progress=False) for c in copies]
  assert results[2]["label"].startswith("fox_again (fox, ")
  results[2]["train_len"] = 16384
  limits = {}

  def finish(fig, ax, path, *args):
    limits[os.path.basename(path)] = ax.get_xlim()
    finish_plot(fig, ax, path, *args)
  finish_plot = plots.finish_plot
  monkeypatch.setattr(plots, "finish_plot", finish)
  evaluator = LanguageModelEvaluator()
  evaluator.write(results, str(tmp_path / "out"), evaluator_options(evaluator))
  labels = [r["label"] for r in json.load(open(tmp_path / "out" / "compare.json"))]
  assert len(set(labels)) == 3
  assert labels[0].startswith("a/fox (fox, ") and labels[1].startswith("b/fox (")
  assert [LanguageModelEvaluator().report(r)[0].split(":")[0] for r in results] == labels
  assert limits["per_token_loss.png"][1] < 100


def test_bad_runs_and_data(runs, tmp_path):
  with pytest.raises(RunError, match="not a run directory"):
    load_run(str(tmp_path))
  (tmp_path / "config.json").write_text(open(os.path.join(runs["fox"], "config.json")).read())
  with pytest.raises(RunError, match="no checkpoint"):
    load_run(str(tmp_path))
  text = tmp_path / "a.txt"
  text.write_text("some words " * 50)
  with pytest.raises(DataError, match="tokenizer mismatch"):
    evaluate_run(runs["fox"], data=[str(text)], progress=False)
  result = subprocess.run([sys.executable, str(REPO / "eval.py"), "--run", str(tmp_path)],
                          capture_output=True, text=True)
  assert result.returncode == 2
  assert result.stderr.strip() == f"error: {tmp_path}: no checkpoint (has the run saved one?)"


def test_text_probes_of_a_run_without_a_tokenizer_are_one_line(runs, tmp_path, gpt2_rank_file, capsys):
  """An MQAR run has no tokenizer: --needle says so (it once said the download failed); with
  --tokenizer-file the flag is used (it was ignored), and GPT-2's ids do not fit the model's 64
  tokens (they were fed in, and the grid scored 0%)."""
  evaluate = cli("eval")
  arguments = ["--run", runs["fox"], "--out", str(tmp_path / "e"), "--needle", "--haystack", str(TEXT)]
  for extra, expected in (([], "this run has no tokenizer (data.kind=mqar"),
                          (["--tokenizer-file", gpt2_rank_file], "the model has 64 tokens, fewer than the GPT-2")):
    capsys.readouterr()
    assert evaluate([*arguments, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1
  assert not (tmp_path / "e").exists()


def test_a_partially_copied_checkpoint_is_a_one_line_error(runs, tmp_path, capsys):
  """A checkpoint step without its state item (a partial copy) gives one line from eval.py,
  generate and train --resume, not Orbax's KeyError traceback; nothing is written."""
  import shutil
  from lpcjax.generate import main as generate
  run_dir = tmp_path / "fox"
  shutil.copytree(runs["fox"], run_dir)
  (step,) = [name for name in os.listdir(run_dir / "checkpoints") if name.isdigit()]
  shutil.rmtree(run_dir / "checkpoints" / step / "state")
  before = sorted(os.listdir(run_dir / "checkpoints" / step))
  for command in (lambda: cli("eval")(["--run", str(run_dir), "--out", str(tmp_path / "e")]),
                  lambda: generate(["--run", str(run_dir), "--token-ids", "1,2"])):
    capsys.readouterr()
    assert command() == 2
    err = capsys.readouterr().err.strip()
    assert f"checkpoint step {step} is incomplete" in err and "'state'" in err and len(err.splitlines()) == 1
  cfg = tiny_experiment(tmp_path, "model.family=fox", "train.steps=6", "train.warmup_steps=1", "train.mesh_data=1",
                        "data.seq_len=16", name="fox")
  with pytest.raises(RunError, match=f"checkpoint step {step} is incomplete"):
    train(cfg, resume=True, progress=False, devices=jax.devices()[:1])
  assert not (tmp_path / "e").exists() and sorted(os.listdir(run_dir / "checkpoints" / step)) == before
  assert [name for name in os.listdir(run_dir / "checkpoints") if name.isdigit()] == [step]


def test_an_interrupted_evaluation_is_one_line_and_keeps_the_old_results(runs, tmp_path, monkeypatch, capsys):
  out = tmp_path / "eval"
  evaluate = cli("eval")
  arguments = ["--run", runs["fox"], "--out", str(out), "--max-sequences", "1"]
  assert evaluate(arguments) == 0
  before = (out / "per_token.json").read_text()
  original = LanguageModelEvaluator.evaluate

  def swallowed(self, run, args):  # a Ctrl-C that the interpreter swallows mid-evaluation
    result = original(self, run, args)
    ctrl_c_swallowed_by_the_interpreter()
    return result

  def interrupted(self, results, out_dir, args):  # a Ctrl-C as the results are being written
    raise KeyboardInterrupt

  for method, replacement in (("evaluate", swallowed), ("write", interrupted)):
    with monkeypatch.context() as patch:
      patch.setattr(LanguageModelEvaluator, method, replacement)
      capsys.readouterr()
      assert evaluate(arguments) == 130
      err = capsys.readouterr().err
      assert err.splitlines()[-1] == "error: interrupted; no new results were written" and "Traceback" not in err
      assert (out / "per_token.json").read_text() == before


def test_recall_by_distance_buckets_by_key_query_distance():
  # Pairs (5 -> 40), (6 -> 41) at 0..3; key 6 queried at 6 (distance 4), key 5 at 20 (distance 20).
  inputs = np.zeros((2, 24), np.int32)
  inputs[0, [0, 1, 2, 3, 6, 7, 20, 21]] = [5, 40, 6, 41, 6, 41, 5, 40]
  inputs[1] = inputs[0]
  targets = np.roll(inputs, -1, axis=1)
  mask = np.zeros((2, 24), np.float32)
  mask[:, [6, 20]] = 1.0
  batch = {"inputs": inputs, "targets": targets, "loss_mask": mask, "valid": np.array([1.0, 0.0])}
  predictions = np.zeros_like(inputs)
  predictions[:, 6] = 41  # right at distance 4, wrong (0) at distance 20; row 1 is padding
  result = recall_by_distance(lambda tokens: predictions, [batch])
  assert result == {"4": {"accuracy": 1.0, "count": 1}, "16": {"accuracy": 0.0, "count": 1}}


def test_needle_placement_and_scoring(gpt2_rank_file):
  tokenizer = load_gpt2_tokenizer(gpt2_rank_file)
  haystack = np.arange(1000, 3000)  # recognisable filler ids
  tokens, position, answer_start = needle_example(haystack, tokenizer, 512, 0.5, "amber-falcon", "4417203")
  needle = tokenizer.encode_ordinary(" One of the special magic numbers for amber-falcon is: 4417203.")
  budget = 512 - len(needle) - (512 - answer_start) - len(tokenizer.encode_ordinary(
      " What is the special magic number for amber-falcon mentioned in the provided text? "
      "The special magic number for amber-falcon mentioned in the provided text is:"))
  assert len(tokens) == 512 and position == round(0.5 * budget)
  assert tokens[position:position + len(needle)].tolist() == needle  # the needle sits at its depth
  assert tokenizer.decode(tokens[answer_start:].tolist()) == " 4417203"

  def oracle(batch):  # predicts every next token correctly
    return np.concatenate([batch[:, 1:], batch[:, :1]], axis=1)

  wrong = lambda batch: np.zeros_like(batch)
  assert score_answers(oracle, [(tokens, position, answer_start)]) == 1.0
  assert score_answers(wrong, [(tokens, position, answer_start)]) == 0.0
  grid = needle_grid(oracle, haystack, tokenizer, [256, 512], [0.0, 0.5, 1.0], trials=2)
  assert grid.shape == (3, 2) and grid.min() == 1.0

  def knows_the_answer(prompts, max_new_tokens):  # generated mode: prompts stop before the answer
    assert [len(p) for p in prompts] == [answer_start] and max_new_tokens == 512 - answer_start
    return [tokens[answer_start:].tolist() + [0]]
  assert score_generated(knows_the_answer, [(tokens, position, answer_start)]) == 1.0
  assert score_generated(lambda prompts, n: [[0] * n], [(tokens, position, answer_start)]) == 0.0


def test_windowed_models_get_a_curve_over_the_whole_sequence(tmp_path):
  """sith predicts m tokens per window: its evaluator slides stride-m windows over a long
  sequence (history before its start = token 0 here) and lines the logits up by position."""
  from lpcjax.models.sith import windowed_logits as sequence_logits
  cfg = models.SITHConfig(vocab_size=40, d_model=32, num_layers=1, num_heads=4, mlp_dim=64, num_filters=9,
                          k=50, chunk_len=6)
  model = models.get("sith").build(cfg)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, cfg.window_len), jnp.int32))["params"]
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 40, (2, 24)))
  logits = sequence_logits(model, params, tokens)
  assert logits.shape == (2, 24, 40)
  padded = jnp.concatenate([jnp.zeros((2, cfg.history_len), tokens.dtype), tokens], axis=1)
  for chunk in range(4):
    window = padded[:, chunk * 6: chunk * 6 + cfg.window_len]
    np.testing.assert_allclose(logits[:, chunk * 6:(chunk + 1) * 6], model.apply({"params": params}, window),
                               atol=1e-5)
  with pytest.raises(ValueError, match="multiple of the model's chunk length"):
    sequence_logits(model, params, tokens[:, :20])


def test_eval_runs_on_a_sith_run(tmp_path):
  import dataclasses
  from lpcjax import experiment as C
  base = tiny_experiment(tmp_path, "train.steps=2", "train.warmup_steps=1", "train.mesh_data=1",
                         "data.mqar_num_pairs=2", name="sith")
  model = models.SITHConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=4, mlp_dim=64, num_filters=9,
                            k=50, chunk_len=12)
  cfg = C.ExperimentConfig(model=model, data=dataclasses.replace(base.data, seq_len=16), train=base.train,
                           name="sith")
  run_dir, _ = train(cfg, progress=False, devices=jax.devices()[:1])
  result = evaluate_run(run_dir, eval_len=48, max_sequences=len(jax.devices()), progress=False)
  assert result["family"] == "sith" and len(result["per_token_loss"]) == 48


def test_sparse_curves_plot_where_they_have_loss(tmp_path):
  """MQAR scores a few positions: the windowed mean is over the scored tokens of each window,
  so the curve exists wherever a window holds one, and a curve with none is not plotted."""
  from lpcjax.evaluation.plots import plot_per_token, windowed_mean
  curve, counts = [None] * 64, [0] * 64
  curve[10], counts[10], curve[40], counts[40] = 2.0, 3, 1.0, 1
  positions, means = windowed_mean(curve, counts, 16)  # means[k]: the window of indices k .. k + 15
  assert positions[0] == 8.5 and len(means) == 49  # 1-based positions 1..16, centred at 8.5
  assert means[0] == 2.0 and means[25] == 1.0 and np.isnan(means[14])
  _, means = windowed_mean(curve, counts, 32)
  assert means[9] == pytest.approx((3 * 2.0 + 1.0) / 4)  # both scored positions, by their counts
  assert plot_per_token([("mqar", {"per_token_loss": curve, "per_token_count": counts}, 32)],
                        str(tmp_path / "sparse.png"), window=16)
  assert (tmp_path / "sparse.png").stat().st_size > 1000
  assert not plot_per_token([("none", {"per_token_loss": [None] * 8, "per_token_count": [0] * 8}, 4)],
                            str(tmp_path / "blank.png"))
  assert not (tmp_path / "blank.png").exists()


def test_a_solved_task_is_drawn_as_solved_not_as_magnified_noise():
  """A solved MQAR run's loss is 1e-5 give or take float noise: the axis is pinned to [0, 1] with
  a note, rather than stretched over the noise; an unsolved curve is drawn as it is."""
  import matplotlib.pyplot as plt

  from lpcjax.evaluation.plots import SOLVED_LOSS, show_solved
  fig, ax = plt.subplots()
  noise = 1.2e-5 + 1e-6 * np.sin(np.arange(64))
  ax.plot(noise)
  assert show_solved(ax, [noise], 0, 1, SOLVED_LOSS) and ax.get_ylim() == (0, 1)
  assert ax.texts[0].get_text().startswith("solved: under 0.001 at every point (largest 1.3e-05)")
  fig2, ax2 = plt.subplots()
  ax2.plot([2.0, 0.5])
  assert not show_solved(ax2, [[2.0, 0.5, np.nan]], 0, 1, SOLVED_LOSS) and not ax2.texts
  plt.close(fig)
  plt.close(fig2)


def test_eval_reads_every_sequence_by_default(tmp_path, gpt2_rank_file):
  """10 held-out windows on 8 devices: two batches, the second padded; every window is scored
  once, the padding nowhere."""
  from lpcjax.data.prepare import tokenizer_hash
  rank_file = gpt2_rank_file
  sha = tokenizer_hash(load_gpt2_tokenizer(rank_file))
  prefix = write_token_file(tmp_path / "tokens", 4000, tokenizer_sha256=sha)
  held_out = write_token_file(tmp_path / "held_out", 10 * 64 + 1, seed=1, tokenizer_sha256=sha)
  cfg = tiny_experiment(tmp_path, "data.kind=tokens", f"data.train_tokens={prefix}", "model.vocab_size=50257",
                        f"data.tokenizer_file={rank_file}",
                        "data.seq_len=16", "train.steps=1", "train.warmup_steps=0", "train.mesh_data=1",
                        "train.eval_batches=1", name="tokens")
  run_dir, _ = train(cfg, progress=False, devices=jax.devices()[:1])
  result = evaluate_run(run_dir, tokens=held_out, eval_len=64, progress=False)
  assert result["num_sequences"] == 10 and len(result["per_sequence_loss"]) == 10
  assert result["eval_data"] == f"token file {held_out}"  # named, in per_token.json and the report
  assert result["num_tokens"] == 10 * 64 and result["per_token_count"] == [10.0] * 64
  assert result["band"]["sequences"] == [10]
  # too little text for the default evaluation length (4 x 16 + 1 tokens): the line names --eval-len
  short = write_token_file(tmp_path / "short", 40, seed=2, tokenizer_sha256=sha)
  with pytest.raises(DataError, match=r"^token file .*short: 40 tokens, fewer than one "
                                      r"window needs \(seq_len \+ 1 = 65\); the evaluation length is 64 \(--eval-len, "
                                      r"default 4x the training length\): pass --eval-len 39 or less"):
    evaluate_run(run_dir, tokens=short, progress=False)
  with pytest.raises(DataError, match=r"--max-sequences: must be >= 1, got 0 \(leave it out to score every"):
    evaluate_run(run_dir, tokens=held_out, eval_len=64, max_sequences=0, progress=False)


def test_needle_plot_of_one_length_keeps_its_title(tmp_path):
  import matplotlib.image
  from lpcjax.evaluation.plots import plot_needle
  title = "Needle in a haystack: fox (llama, RoPE, 7.3M)"
  plot_needle(np.ones((11, 1)), [1024], [i / 10 for i in range(11)], str(tmp_path / "needle.png"), title=title)
  height, width, _ = matplotlib.image.imread(str(tmp_path / "needle.png")).shape
  assert width >= 5.5 * 120  # wide enough for the title, however few the lengths


def test_needle_generated_answers_agree_with_teacher_forced(gpt2_rank_file, tmp_path):
  """eval.py --needle --needle-mode both on a tiny text run: greedy cached decoding reproduces
  the answer exactly when every teacher-forced argmax does, so the two grids are equal."""
  essay = str(TEXT)
  cfg = tiny_experiment(tmp_path, "data.kind=text", f"data.train_files={essay}", f"data.eval_files={essay}",
                        f"data.tokenizer_file={gpt2_rank_file}", "model.vocab_size=50257",
                        "data.seq_len=64", "train.steps=2", "train.warmup_steps=1", "train.eval_batches=1")
  run_dir, _ = train(cfg, progress=False)
  result = evaluate_run(run_dir, needle=True, needle_mode="both", needle_lengths=[160], haystack=[essay],
                        max_sequences=8, eval_len=64, progress=False)
  assert np.array(result["needle_generated"]["accuracy"]).shape == (len(result["needle"]["depths"]), 1)
  assert result["needle_generated"]["accuracy"] == result["needle"]["accuracy"]


def test_a_checkpoint_that_no_longer_matches_its_model_is_a_one_line_error(tmp_path):
  """A run whose saved tree differs from the model its config.json builds (another version of
  the model code): one line naming the first difference, not Orbax's tree diff."""
  cfg = tiny_experiment(tmp_path, "train.steps=1", "train.warmup_steps=0", "train.eval_batches=1", name="old")
  run_dir, _ = train(cfg, progress=False)
  saved = json.load(open(os.path.join(run_dir, "config.json")))
  for field, value, expected in (("block", "pro", "g_proj: the checkpoint lacks it"),
                                 ("d_model", 64, "where the model needs (")):  # which array: restore order
    changed = json.loads(json.dumps(saved))
    changed["model"][field] = value
    json.dump(changed, open(os.path.join(run_dir, "config.json"), "w"))
    with pytest.raises(RunError) as error:
      load_run(run_dir)
    assert expected in str(error.value) and len(str(error.value).splitlines()) == 1


def test_a_flat_curve_is_labelled_by_its_values_not_an_offset(tmp_path):
  """A solved task's perplexity (1.0000001...) once read "1e-7+1" on the axis."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from lpcjax.evaluation.plots import finish_plot
  fig, ax = plt.subplots()
  ax.plot([8, 16, 32], [1.0000001, 1.0000002, 1.0000004], label="solved")
  finish_plot(fig, ax, str(tmp_path / "flat.png"), "L", "perplexity")
  formatter = ax.yaxis.get_major_formatter()
  assert formatter.get_offset() == "" and all(label.startswith("1.0000") for label in formatter.format_ticks(
      ax.get_yticks()))


def test_a_curve_of_one_window_is_drawn_as_a_point_with_its_error_bar(tmp_path):
  """An evaluation as long as the window (the default job's 64 tokens) gives one point and one
  bin: they must show (a marker and an error bar), not a line of zero length."""
  import matplotlib.image
  from lpcjax.evaluation.plots import plot_per_token
  curve, counts = [None] * 64, [0] * 64
  curve[10], counts[10], curve[40], counts[40] = 2.0, 3, 1.0, 1
  band = {"centers": [32.5], "mean": [1.75], "stderr": [0.2]}
  path = tmp_path / "one.png"
  assert plot_per_token([("one", {"per_token_loss": curve, "per_token_count": counts, "band": band}, None)],
                        str(path), window=64)
  pixels = matplotlib.image.imread(str(path))[..., :3]
  blue = np.abs(pixels - np.array([31, 119, 180]) / 255).max(axis=-1) < 0.08  # the line's colour, tab:blue
  assert blue.sum() > 300, blue.sum()  # the legend's sample alone is ~60 pixels
