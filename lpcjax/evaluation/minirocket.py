"""MiniRocket, the strongest simple control of time-series classification (Dempster, Schmidt and
Webb, KDD 2021): about 10,000 features of frozen random convolutions (aeon's ``MiniRocket``,
fitted on the training split alone: it draws its dilations and biases from those series) and a
ridge classifier whose penalty is chosen by leave-one-out (``series_probes``' "ridge"), as the
ROCKET papers ran it. A pre-trained encoder that does not beat it has learned nothing a reader
could not get for free. aeon is an optional extra: pip install 'lpcjax[rocket]'."""

import numpy as np

from lpcjax.errors import UserError

EXTRA = "rocket"


class MissingExtraError(UserError, ImportError):
  """A control whose optional dependency is not installed; the message names the extra."""


def minirocket_class():
  """aeon's MiniRocket transform, or a one-line error naming the extra (callers ask first, so
  that a missing extra fails before any encoder work)."""
  try:
    from aeon.transformations.collection.convolution_based import MiniRocket
  except ImportError:
    raise MissingExtraError(f"the MiniRocket control needs aeon: pip install 'lpcjax[{EXTRA}]'") from None
  return MiniRocket


def minirocket_features(train_x, test_x, *, num_kernels=10_000, seed=0):
  """(train [N, F], test [M, F]) MiniRocket features of series x [N, T, C] (missing samples 0,
  the standardized mean: MiniRocket takes no NaN), the transform fitted on ``train_x``."""
  MiniRocket = minirocket_class()
  # aeon's layout is [cases, channels, time points], float64
  to_aeon = lambda x: np.ascontiguousarray(np.nan_to_num(np.asarray(x, np.float64)).transpose(0, 2, 1))
  transform = MiniRocket(n_kernels=num_kernels, random_state=seed).fit(to_aeon(train_x))
  return transform.transform(to_aeon(train_x)), transform.transform(to_aeon(test_x))
