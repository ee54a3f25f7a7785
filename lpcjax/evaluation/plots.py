"""PNG plots (matplotlib, no display needed)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def moving_average(values, window):
  values = np.asarray(values, np.float64)
  if window <= 1 or len(values) < window:
    return np.arange(1, len(values) + 1), values
  kernel = np.ones(window) / window
  return np.arange(window, len(values) + 1), np.convolve(values, kernel, mode="valid")


def _finish(fig, ax, path, xlabel, ylabel):
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_per_token(runs, path, window=64, log_x=False):
  """runs: [(label, result dict from summarize, training length)]."""
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for label, result, train_len in runs:
    curve = np.array([np.nan if x is None else x for x in result["per_token_loss"]])
    positions, smooth = moving_average(curve, window)
    line, = ax.plot(positions, smooth, label=label, linewidth=1.4)
    if train_len:
      ax.axvline(train_len, color=line.get_color(), linestyle=":", linewidth=1)
  if log_x:
    ax.set_xscale("log")
  ax.set_title("Per-token loss")
  _finish(fig, ax, path, "token position (dotted: training length)", f"loss (moving average, {window} tokens)")


def plot_perplexity(runs, path):
  """Perplexity over the first L tokens against L, one line per run."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, result, _ in runs:
    lengths = sorted(int(k) for k in result["by_context_length"])
    ax.plot(lengths, [result["by_context_length"][str(n)]["perplexity"] for n in lengths], "o-", label=label)
  ax.set_xscale("log", base=2)
  _finish(fig, ax, path, "context length L", "perplexity over the first L tokens")


def plot_needle(grid, lengths, depths, path, title="Needle in a haystack"):
  fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 4.5))
  image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
  ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
  ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
  ax.set_xlabel("context length")
  ax.set_ylabel("needle depth")
  ax.set_title(title)
  fig.colorbar(image, ax=ax, label="exact-match accuracy")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
