"""Associative recall (MQAR) accuracy as a function of the key-query distance."""

import numpy as np


def recall_by_distance(predict_fn, batches):
  """{bucket: {"accuracy", "count"}} over MQAR batches; bucket "2^k" holds distances in
  [2^k, 2^(k+1)), the distance being from the key's first occurrence to its query.
  predict_fn: tokens [batch, T] -> argmax predictions [batch, T]. Padding rows (``valid`` = 0)
  are skipped."""
  hits, counts = {}, {}
  for batch in batches:
    predictions = np.asarray(predict_fn(batch["inputs"]))
    valid = batch.get("valid", np.ones(batch["inputs"].shape[0]))
    for row in np.flatnonzero(valid):
      inputs = batch["inputs"][row]
      for t in np.flatnonzero(batch["loss_mask"][row]):
        first = int(np.flatnonzero(inputs == inputs[t])[0])
        bucket = 1 << int(np.log2(max(t - first, 1)))
        hits[bucket] = hits.get(bucket, 0) + int(predictions[row, t] == batch["targets"][row, t])
        counts[bucket] = counts.get(bucket, 0) + 1
  return {str(b): {"accuracy": hits[b] / counts[b], "count": counts[b]} for b in sorted(counts)}
