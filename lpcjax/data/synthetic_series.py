"""Generated time-series classification: the ``synthetic_series`` data kind (PMT's cue task).

The UCR sets that fit a CPU are too small for PMT's in-batch contrastive objective (the paper
left out sets of tens of series: every negative comes from another series of the batch), and
the paper's own cue-retention set, FordA, is 3,601 series of 500 samples. This kind is a
seeded stand-in of that size: by default 2,048 training, 512 evaluation and 512 test series
of 256 samples, univariate, read by the PMT family like the ``series`` kind (the same example
``{x [T, 1], label}`` and the same source attributes ``x``, ``labels``, ``classes``), so the
linear probes and the cue-retention probe of ``lpcjax.evaluation.series`` run on it unchanged.

Series i of a split comes from the RNG of (``generator_seed``, split, i) (``generated.example_rng``):
any series can be regenerated alone, and the three splits never share one. The set does not
depend on the training seed (like a file, and like the ``series`` kind's ``split_seed``), so
runs of different seeds pre-train on the same series and their probes score the same ones.

The generator's choices, and why:

* Classes (``synthetic_classes``, the first k of ``PROCESSES``; label = i mod k, so every
  split is balanced): a mixture of two slow sines (0.01–0.02 cycles per sample), a mixture of
  two fast sines (0.06–0.09), an AR(2) resonance (narrow-band noise at 0.03–0.045, pole radius
  0.95) and shapelets (a 12-sample square pulse, + or −, at about one random place per 40
  samples). Each draws its frequencies, phases, weights and positions per series: the class
  is a kind of process, not a template, so a probe must read the dynamics. The bands do not
  overlap, so the label is recoverable from the amplitude spectrum alone (the tests check that
  a nearest-centroid on it separates the classes): the linear probe has something to find.
* Difficulty (``synthetic_noise``): white noise of that standard deviation is added to the
  signal, whose RMS is 1 times a per-series amplitude drawn from U[0.5, 1.5]. At 0.5 (the
  default) the classes stay separable; near 2 and above the spectra drown.
* Scale: each series is divided by the expected standard deviation sqrt(E[a²] + noise²),
  so the data is on the standardized scale the ``series`` kind fits (mean 0, std ≈ 1) without
  a statistic fitted over other series, which would tie one series to the rest of its split.
* No cue: the cue-retention probe inserts its Hann burst itself at evaluation time (the model
  never sees one in pre-training, as in the paper); the processes are stationary, so where the
  burst sits is the only thing that differs between the positions it can take.

The splits are generated whole on first use (a few hundred milliseconds) and cached per
(config, split); the arrays are read-only.
"""

import dataclasses
import functools
import math
from typing import ClassVar

import numpy as np

from lpcjax.config import DataConfig, require

from .errors import DataError
from .generated import SPLITS, example_rng
from .registry import DataKind, register

SHAPELET = np.repeat([1.0, -1.0], 6)  # a 12-sample square pulse: sharp edges, a broad spectrum
MEAN_SQUARE_AMPLITUDE = (1.5**3 - 0.5**3) / 3  # E[a²] for a ~ U[0.5, 1.5]


def _sines(rng, t, band):
  """Two sines with frequencies in ``band`` (cycles per sample), random phases and weights."""
  frequency = rng.uniform(*band, size=2)
  phase = rng.uniform(0, 2 * np.pi, size=2)
  weight = rng.uniform(0.5, 1.0, size=2)
  return (weight[:, None] * np.sin(2 * np.pi * frequency[:, None] * t + phase[:, None])).sum(0)


def slow_sines(rng, t):
  return _sines(rng, t, (0.01, 0.02))


def fast_sines(rng, t):
  return _sines(rng, t, (0.06, 0.09))


def ar2_resonance(rng, t, burn_in=100):
  """x_s = 2 r cos(2π f) x_{s-1} − r² x_{s-2} + e_s: noise band-passed around f (its own phase);
  the first ``burn_in`` samples are dropped so that the series starts stationary."""
  from scipy.signal import lfilter  # here, not at the top: scipy.signal takes a second to import

  frequency, radius = rng.uniform(0.03, 0.045), 0.95
  noise = rng.normal(size=len(t) + burn_in)
  return lfilter([1.0], [1.0, -2 * radius * np.cos(2 * np.pi * frequency), radius**2], noise)[burn_in:]


def shapelets(rng, t):
  """The square pulse, + or − with a random weight, at random places (at least one)."""
  out = np.zeros(len(t))
  count = max(1, rng.poisson(len(t) / 40))
  for start, sign, weight in zip(rng.integers(0, len(t) - len(SHAPELET) + 1, count),
                                 rng.choice([-1.0, 1.0], count), rng.uniform(0.5, 1.0, count)):
    out[start:start + len(SHAPELET)] += sign * weight * SHAPELET
  return out


PROCESSES = {"slow sines": slow_sines, "fast sines": fast_sines, "AR(2) resonance": ar2_resonance,
             "shapelets": shapelets}


@dataclasses.dataclass(frozen=True)
class SyntheticSeriesConfig(DataConfig):
  """Generated series (see the module docstring): ``{train,eval,test}_series`` per split,
  ``synthetic_classes`` processes, ``synthetic_noise`` the difficulty, ``generator_seed`` the set."""

  kind: ClassVar[str] = "synthetic_series"

  seq_len: int = 128
  batch_size: int = 32
  train_series: int = 2048
  eval_series: int = 512
  test_series: int = 512
  synthetic_classes: int = 4
  synthetic_noise: float = 0.5
  generator_seed: int = 0

  def __post_init__(self):
    super().__post_init__()
    require(self.seq_len >= 2 * len(SHAPELET), "data.seq_len",
            f"must be >= {2 * len(SHAPELET)} (twice the shapelet), got {self.seq_len}")
    require(2 <= self.synthetic_classes <= len(PROCESSES), "data.synthetic_classes",
            f"must be in [2, {len(PROCESSES)}] (the processes: {', '.join(PROCESSES)}), got {self.synthetic_classes}")
    require(math.isfinite(self.synthetic_noise) and self.synthetic_noise >= 0, "data.synthetic_noise",
            f"must be a finite number >= 0, got {self.synthetic_noise}")
    require(self.train_series >= max(self.batch_size, self.synthetic_classes), "data.train_series",
            f"{self.train_series} series cannot fill a batch of {self.batch_size} (data.batch_size) "
            f"and hold all {self.synthetic_classes} classes")
    for split in ("eval", "test"):
      require(getattr(self, f"{split}_series") >= self.synthetic_classes, f"data.{split}_series",
              f"must be >= data.synthetic_classes ({self.synthetic_classes}), so that every class occurs")

  def num_series(self, split):
    return getattr(self, f"{split}_series")


def synthetic_series(config, split, index):
  """(x [seq_len, 1] float32, label): series ``index`` of ``split``, from its own RNG alone."""
  rng = example_rng(config.generator_seed, split, index)
  label = index % config.synthetic_classes
  t = np.arange(config.seq_len, dtype=np.float64)
  signal = list(PROCESSES.values())[label](rng, t)
  signal *= rng.uniform(0.5, 1.5) / np.sqrt(np.mean(signal**2))
  noisy = signal + config.synthetic_noise * rng.normal(size=len(t))
  scale = np.sqrt(MEAN_SQUARE_AMPLITUDE + config.synthetic_noise**2)
  return (noisy / scale).astype(np.float32)[:, None], label


@functools.lru_cache(maxsize=8)
def _generate(config, split):
  pairs = [synthetic_series(config, split, i) for i in range(config.num_series(split))]
  x, labels = np.stack([x for x, _ in pairs]), np.array([label for _, label in pairs], np.int32)
  x.flags.writeable = labels.flags.writeable = False
  return x, labels


class SyntheticSeriesSource:
  """One split, with the ``series`` kind's interface: ``x`` [N, T, 1], ``labels`` int32 [N]
  indexing ``classes`` (the process names)."""

  def __init__(self, config, seed, split):
    del seed  # the set is the generator's (config.generator_seed), the same for every training seed
    if split not in SPLITS:
      raise DataError(f"data: unknown split {split!r}; synthetic_series has {sorted(SPLITS)}")
    self.x, self.labels = _generate(config, split)
    self.classes = tuple(PROCESSES)[:config.synthetic_classes]
    self.num_channels, self.num_classes = 1, config.synthetic_classes

  def __len__(self):
    return len(self.x)

  def __getitem__(self, index):
    return {"x": self.x[index], "label": self.labels[index]}


register(DataKind("synthetic_series", SyntheticSeriesConfig, SyntheticSeriesSource))
