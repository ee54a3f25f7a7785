"""A toy non-token family, defined only for the tests: it proves that a family plugs into
train.py and eval.py through its declarations alone (docs/adding_a_family.md).

* data kind ``toy_series``: a finite set of float series [T, C] whose class sets the frequency;
* family ``toy_classifier``: Dense -> BatchNorm -> ReLU -> Dropout -> mean over time -> Dense;
  BatchNorm statistics are a mutable collection, dropout draws from the step's rng;
* its evaluator: accuracy and a confusion matrix over the evaluation set, JSON and a PNG;
* family ``toy_lm``: a language model (the zoo's decoder under another name) that decodes, so
  that ``python -m lpcjax.generate`` is tested on a family from outside the package too.
"""

import dataclasses
import os
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpcjax import data, models
from lpcjax.config import DataConfig, ModelConfig, TrainConfig, require
from lpcjax.data import MQARDataConfig
from lpcjax.models.decoder import init_cache
from lpcjax.experiment import ExperimentConfig
from lpcjax.files import write_json_atomic


@dataclasses.dataclass(frozen=True)
class ToySeriesConfig(DataConfig):
  kind: ClassVar[str] = "toy_series"

  seq_len: int = 16
  batch_size: int = 8
  num_examples: int = 20  # not a multiple of the batch: evaluation must pad, not drop
  num_channels: int = 3
  num_classes: int = 3

  def __post_init__(self):
    super().__post_init__()
    require(self.num_classes >= 2, "data.num_classes", "must be >= 2")


class ToySeriesSource:
  def __init__(self, config, seed, split):
    self.config, self.seed, self.split = config, seed, 0 if split == "train" else 1

  def __len__(self):
    return self.config.num_examples

  def __getitem__(self, index):
    cfg = self.config
    rng = np.random.default_rng([self.seed, self.split, index])
    label = index % cfg.num_classes
    t = np.arange(cfg.seq_len)[:, None]
    x = np.sin(2 * np.pi * (label + 1) * t / cfg.seq_len + rng.uniform(0, 2 * np.pi, cfg.num_channels))
    x = x + 0.3 * rng.normal(size=x.shape)
    return {"x": x.astype(np.float32), "label": np.int32(label)}


@dataclasses.dataclass(frozen=True)
class ToyClassifierConfig(ModelConfig):
  family: ClassVar[str] = "toy_classifier"
  data_kinds: ClassVar[tuple] = ("toy_series",)

  width: int = 16
  num_classes: int = 3
  dropout: float = 0.2


class ToyClassifier(nn.Module):
  config: ToyClassifierConfig

  @nn.compact
  def __call__(self, x, train=False):
    cfg = self.config
    h = nn.Dense(cfg.width)(x)
    h = nn.BatchNorm(use_running_average=not train, momentum=0.9)(h)
    h = nn.Dropout(cfg.dropout, deterministic=not train)(nn.relu(h))
    return nn.Dense(cfg.num_classes)(h.mean(axis=1))


def classification_loss(apply_fn, params, batch, *, rng, step, mutable, train):
  del step
  variables = {"params": params, **mutable}
  if train:
    logits, new_mutable = apply_fn(variables, batch["x"], train=True, rngs={"dropout": rng},
                                   mutable=["batch_stats"])
  else:
    logits, new_mutable = apply_fn(variables, batch["x"]), mutable
  weights = batch.get("valid", jnp.ones(batch["label"].shape, jnp.float32))
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * weights
  hits = (jnp.argmax(logits, -1) == batch["label"]) * weights
  count = weights.sum()
  return losses.sum() / count, {"loss": (losses.sum(), count), "accuracy": (hits.sum(), count)}, new_mutable


class ToyEvaluator:
  def add_arguments(self, parser):
    parser.add_argument("--max-examples", type=int, default=None, help="default: every example")

  def evaluate(self, run, options):
    dataset = data.make_dataset(run.config.data, run.config.train.seed, "eval", max_examples=options.max_examples)
    predict = jax.jit(lambda variables, x: jnp.argmax(run.model.apply(variables, x), -1))
    confusion = np.zeros((run.config.data.num_classes,) * 2, np.int64)
    for i in range(len(dataset)):
      batch = dataset[i]
      predicted = np.asarray(predict(run.variables, batch["x"]))
      for label, guess, valid in zip(batch["label"], predicted, batch["valid"]):
        confusion[label, guess] += int(valid)
    return {"run": run.run_dir, "label": run.config.name, "examples": int(confusion.sum()),
            "accuracy": float(np.trace(confusion) / confusion.sum()), "confusion": confusion.tolist()}

  def write(self, results, out_dir, options):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    write_json_atomic(os.path.join(out_dir, "toy.json"), results)
    fig, ax = plt.subplots()
    ax.bar([r["label"] for r in results], [r["accuracy"] for r in results])
    ax.set_ylabel("accuracy")
    fig.savefig(os.path.join(out_dir, "accuracy.png"))
    plt.close(fig)

  def report(self, result):
    return [f"{result['label']}: accuracy {result['accuracy']:.3f} over {result['examples']} examples"]


@dataclasses.dataclass(frozen=True)
class ToyLMConfig(models.FoXConfig):
  family: ClassVar[str] = "toy_lm"


def register():
  """Idempotent: the test module and experiment files both call it."""
  if "toy_series" not in data.names():
    data.register(data.DataKind("toy_series", ToySeriesConfig, ToySeriesSource))
  if "toy_classifier" not in models.names():
    models.register(models.Family(
        "toy_classifier", ToyClassifierConfig, ToyClassifier, loss=classification_loss,
        example_inputs=lambda d: (jnp.zeros((1, d.seq_len, d.num_channels), jnp.float32),),
        mutable=("batch_stats",),
        rng_streams=("dropout",), throughput_unit="samples", units_per_example=lambda config: 1,
        evaluator=ToyEvaluator))
  if "toy_lm" not in models.names():
    models.register(models.language_model_family("toy_lm", ToyLMConfig, models.DecoderLM, init_cache=init_cache))


register()  # at import: a run records this module, and a fresh eval.py imports it to find the family


def experiment(run_dir, **train_fields):
  register()
  train = TrainConfig(**{"steps": 8, "learning_rate": 1e-2, "warmup_steps": 1, "log_every": 1, "eval_batches": 0,
                         "run_dir": str(run_dir), **train_fields})
  return ExperimentConfig(model=ToyClassifierConfig(), data=ToySeriesConfig(), train=train, name="toy")


def lm_experiment(run_dir):
  register()
  model = ToyLMConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2, mlp_multiple_of=32)
  train = TrainConfig(steps=1, warmup_steps=0, eval_batches=1, run_dir=str(run_dir))
  return ExperimentConfig(model=model, data=MQARDataConfig(seq_len=16, batch_size=8, mqar_vocab_size=64,
                                                           mqar_num_pairs=2), train=train, name="toy_lm")
