"""Readers of the UEA/UCR archive's other two formats, ``.ts`` (sktime's text format) and
``.arff`` (Weka; read with scipy.io.arff), univariate or multivariate, equal or variable
length. Each returns ``(x float32 [N, T, C] NaN-padded at the end, raw labels [N])`` or raises
``DataError`` with a one-line message naming the file and, where known, the line.

``.ts``: ``@`` header lines (``@timeStamps true`` is refused: only the value lists are read),
``#`` comments, then after ``@data`` one series a line: the channels separated by ``:``, each a
comma-separated list of values (``?`` or ``NaN``: missing), the class label last (when
``@classLabel true``; otherwise every label is 0). ``.arff``: a univariate file has one numeric
attribute per time step and a class attribute; a multivariate one has a relational attribute
whose rows are the channels.
"""

import math

import numpy as np

from .errors import DataError


def _pad(series, path):
  """[N] lists of [C, T_i] arrays -> [N, max T, C], NaN-padded; every series needs the same C."""
  channels = {s.shape[0] for s in series}
  if len(channels) > 1:
    raise DataError(f"{path}: series have different numbers of channels ({sorted(channels)})")
  length = max(s.shape[1] for s in series)
  x = np.full((len(series), length, channels.pop()), np.nan, np.float32)
  for i, s in enumerate(series):
    x[i, :s.shape[1]] = s.T
  return x


def _value(text):
  text = text.strip()
  if text in ("?", "", "NaN", "nan"):
    return math.nan
  value = float(text)
  if math.isinf(value):
    raise ValueError(text)
  return value


def read_ts(path):
  header, series, labels, has_labels = {}, [], [], True
  with open(path, "rt") as f:
    in_data = False
    for number, line in enumerate(f, 1):
      line = line.strip()
      if not line or line.startswith("#"):
        continue
      if not in_data:
        if not line.startswith("@"):
          raise DataError(f"{path}: line {number}: expected an @ header line before @data, got {line[:40]!r}")
        key, value = (line[1:].split(None, 1) + [""])[:2]  # "@key value", space or tab
        key = key.lower()
        if key == "data":
          in_data = True
          has_labels = (header.get("classlabel", "").split() or ["true"])[0].lower() == "true"
          if header.get("timestamps", "false").lower() == "true":
            raise DataError(f"{path}: @timeStamps true is not supported (only value lists are read)")
        header[key] = value.strip()
        continue
      fields = line.split(":")
      if has_labels:
        if len(fields) < 2:
          raise DataError(f"{path}: line {number}: expected channels and a class label separated by ':'")
        labels.append(fields[-1].strip())
        fields = fields[:-1]
      else:
        labels.append("0")
      try:
        channels = [[_value(v) for v in field.split(",")] for field in fields]
      except ValueError:
        raise DataError(f"{path}: line {number}: a value is not a finite number, '?' or NaN") from None
      length = max(map(len, channels))
      array = np.full((len(channels), length), np.nan)
      for c, values in enumerate(channels):
        array[c, :len(values)] = values
      series.append(array)
  if not in_data:
    raise DataError(f"{path}: no @data line: not a .ts file")
  if not series:
    raise DataError(f"{path}: empty file (no series)")
  return _pad(series, path), np.array(labels)


def read_arff(path):
  from scipy.io import arff  # only here: scipy is not imported for the other formats

  try:
    rows, meta = arff.loadarff(path)
  except (arff.ArffError, ValueError, NotImplementedError) as error:
    raise DataError(f"{path}: cannot read as ARFF: {str(error).splitlines()[0] if str(error) else error!r}") from None
  names = meta.names()
  types = meta.types()
  nominal = [n for n, t in zip(names, types) if t == "nominal"]
  if not nominal:
    raise DataError(f"{path}: no nominal (class) attribute")
  label_name = nominal[-1]
  decode = lambda v: v.decode() if isinstance(v, bytes) else str(v)
  labels = np.array([decode(v) for v in rows[label_name]])
  relational = [n for n, t in zip(names, types) if t == "relational"]
  if relational:  # multivariate: each row of the relational value is a channel
    series = [np.array(r.tolist(), np.float64).reshape(len(r), -1) for r in rows[relational[0]]]
  else:
    steps = [n for n, t in zip(names, types) if t == "numeric"]
    if not steps:
      raise DataError(f"{path}: no numeric attributes (time steps)")
    values = np.stack([rows[n].astype(np.float64) for n in steps], axis=1)  # [N, T]
    series = [v[None] for v in values]
  if not series:
    raise DataError(f"{path}: empty file (no series)")
  series = [_trim(s) for s in series]
  if any(np.isinf(s).any() for s in series):
    raise DataError(f"{path}: infinite values")
  return _pad(series, path), labels


def _trim(s):
  """Drop trailing all-missing time steps (variable-length series are '?'-padded in ARFF)."""
  present = np.flatnonzero(~np.isnan(s).all(0))
  return s[:, :present[-1] + 1] if len(present) else s
