"""The FoX paper's sizes: ``--config paper:<family>[_pro]_<size>``.

family: fox | transformer; size: 125m | 360m | 760m. For example ``paper:fox_pro_760m``.
Training data is not set here: add ``data.train_tokens=PREFIX`` (see docs/training.md, "Train on real text").
"""

from lpcjax.paper_recipe import paper_experiment


def get_config(spec="fox_125m"):
  parts = spec.split("_")
  family, size = parts[0], parts[-1]
  block = "pro" if "pro" in parts[1:-1] else "llama"
  return paper_experiment(family, size, block=block)
