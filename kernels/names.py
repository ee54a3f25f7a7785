"""The names of lpcjax's own attention backends, for a config check before JAX loads (the
backends' table, backends.py, needs JAX to be imported). Standard library only."""

import sys

BUILT_IN = ("auto", "mosaic_gpu", "mosaic_gpu_fused", "mosaic_gpu_hw", "mosaic_gpu_v1", "pallas", "pallas_tpu",
            "reference", "triton", "xla")


def known_impls():
  """The built-in names, and those registered in this process: registering a backend of one's
  own imports the table, so a table not yet imported holds none of one's own."""
  table = sys.modules.get(f"{__package__}.backends")
  return sorted(set(BUILT_IN) | set(table.available_impls() if table is not None else ()))
