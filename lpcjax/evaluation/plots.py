"""PNG plots (matplotlib, no display needed)."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def windowed_mean(curve, counts, window):
  """(centres, means): the mean loss over the scored tokens of each window of ``window``
  positions (sum of losses / number of scored tokens), so a curve scored only at some positions
  (MQAR answers) still has a value wherever its window holds one; NaN where none does."""
  counts = np.asarray(counts, np.float64)
  sums = np.nan_to_num(np.asarray(curve, np.float64)) * counts
  window = max(1, min(window, len(counts)))
  kernel = np.ones(window)
  with np.errstate(invalid="ignore", divide="ignore"):
    means = np.convolve(sums, kernel, mode="valid") / np.convolve(counts, kernel, mode="valid")
  return np.arange(window, len(counts) + 1) - (window - 1) / 2, means  # positions (1-based) at window centres


def finish_plot(fig, ax, path, xlabel, ylabel, legend_outside=False):
  """Labels, grid, legend (``legend_outside``: right of the axes, where it covers nothing),
  then save the figure at ``path`` and close it."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  # a nearly flat curve (a solved task's perplexity of 1.0000001) reads as its values, not as
  # matplotlib's offset notation ("1e-7+1") on a linear axis
  if ax.get_yscale() == "linear":
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
  if legend_outside:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
  else:
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight" if legend_outside else None)
  plt.close(fig)


SOLVED_LOSS = 1e-3  # nats: below it at every position a loss curve is float noise (perplexity < 1.001)


def show_solved(ax, curves, low, high, floor_value):
  """When every curve's largest value is under its floor (``floor_value``: the loss's
  SOLVED_LOSS, or the perplexity it gives), pin the y-axis to [low, high] and say the task is
  solved, instead of letting matplotlib magnify float noise into a curve. Returns whether it did."""
  values = np.concatenate([np.asarray(curve, np.float64).ravel() for curve in curves]) if curves else np.array([])
  values = values[np.isfinite(values)]
  if not values.size or values.max() >= floor_value:
    return False
  ax.set_ylim(low, high)
  ax.text(0.5, 0.5, f"solved: under {floor_value:.4g} at every point (largest {values.max():.3g}); the rest is "
          "float noise", transform=ax.transAxes, ha="center", va="center", fontsize=9,
          bbox=dict(boxstyle="round", facecolor="white", alpha=0.8))
  return True


def plot_per_token(runs, path, window=64, log_x=False):
  """runs: [(label, result dict from summarize, training length)]. Returns False, writing
  nothing, when no run has a scored position (a blank plot says nothing)."""
  fig, ax = plt.subplots(figsize=(7, 4.5))
  drawn, curves = False, []
  for label, result, train_len in runs:
    curve = [np.nan if x is None else x for x in result["per_token_loss"]]
    positions, smooth = windowed_mean(curve, result["per_token_count"], window)
    curves.append(smooth)
    points = int(np.isfinite(smooth).sum())
    drawn |= points > 0
    # An evaluation no longer than a window or two gives a point or two: a bare line would not show.
    line, = ax.plot(positions, smooth, "o-" if points < 3 else "-", label=label, linewidth=1.4)
    band = result.get("band")
    if band:  # mean +- standard error over sequences, per bin
      centers, mean, stderr = (np.array([np.nan if x is None else x for x in band[k]], np.float64)
                               for k in ("centers", "mean", "stderr"))
      if len(centers) > 1:
        ax.fill_between(centers, mean - stderr, mean + stderr, color=line.get_color(), alpha=0.2, linewidth=0,
                        step="mid")
      else:  # one bin: a band of zero width would not show either
        ax.errorbar(centers, mean, yerr=stderr, color=line.get_color(), capsize=4, linestyle="none")
    if train_len and train_len <= len(curve):  # a converted run's nominal 16k would set the x-axis
      ax.axvline(train_len, color=line.get_color(), linestyle=":", linewidth=1)
  if not drawn:
    plt.close(fig)
    if os.path.exists(path):  # an earlier evaluation's plot would no longer describe this one
      os.remove(path)
    return False
  if log_x:
    ax.set_xscale("log")
  show_solved(ax, curves, 0, 1, SOLVED_LOSS)
  ax.set_title("Per-token loss")
  finish_plot(fig, ax, path, "token position (dotted: training length; band: ±1 standard error over sequences)",
          f"loss over the scored tokens of {window} positions")
  return True


def plot_perplexity(runs, path):
  """Perplexity over the first L tokens against L, one line per run."""
  fig, ax = plt.subplots(figsize=(6, 4))
  curves = []
  for label, result, _ in runs:
    cells = result["by_context_length"]
    lengths = sorted(int(k) for k, cell in cells.items() if cell["perplexity"] is not None)
    curves.append([cells[str(n)]["perplexity"] for n in lengths])
    ax.plot(lengths, curves[-1], "o-", label=label)
  ax.set_xscale("log", base=2)
  show_solved(ax, curves, 1, 2, float(np.exp(SOLVED_LOSS)))
  finish_plot(fig, ax, path, "context length L", "perplexity over the first L tokens")


def plot_answers(runs, path):
  """Accuracy at the answers by difficulty bucket (MQAR: key-query distance), one line per run,
  with the counts and chance as a dotted line."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, result, _ in runs:
    by_bucket = result["answers"]["by_bucket"]
    buckets = sorted(int(b) for b in by_bucket)
    cells = [by_bucket[str(b)] for b in buckets]
    ax.plot(buckets, [c["accuracy"] for c in cells], "o-", label=label)
    for bucket, cell in zip(buckets, cells):
      ax.annotate(f"n={cell['count']}", (bucket, cell["accuracy"]), fontsize=7, textcoords="offset points",
                  xytext=(0, 5), ha="center")
  answers = runs[0][1]["answers"]
  ax.axhline(answers["chance"], color="gray", linestyle=":", label=f"chance ({answers['chance']:.1%})")
  if max(int(b) for _, r, _ in runs for b in r["answers"]["by_bucket"]) >= 4:
    ax.set_xscale("log", base=2)
  ax.set_ylim(-0.05, 1.1)
  name = answers["bucket_name"]
  xlabel = "distance from key to query (tokens, bucket start)" if name == "key-query distance" else name
  finish_plot(fig, ax, path, xlabel, "accuracy at the answers")


def plot_needle(grid, lengths, depths, path, title="Needle in a haystack"):
  fig, ax = plt.subplots(figsize=(max(5.5, 1.2 + 0.9 * len(lengths)), 4.5))
  image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
  ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
  ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
  ax.set_xlabel("context length")
  ax.set_ylabel("needle depth")
  ax.set_title(title, fontsize=10, wrap=True)
  fig.colorbar(image, ax=ax, label="exact-match accuracy")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
