"""Accuracy at the answers of generated tasks, overall and by difficulty bucket (MQAR: recall
by key-query distance)."""

import numpy as np


def _query_distance_buckets(inputs, positions):
  """MQAR batches without ``answer_bucket``: the distance from the key's first occurrence to its
  query, bucketed by powers of two."""
  buckets = []
  for t in positions:
    first = int(np.flatnonzero(inputs == inputs[t])[0])
    buckets.append(1 << int(np.log2(max(t - first, 1))))
  return buckets


def answer_accuracy(predict_fn, batches):
  """{"accuracy", "count", "by_bucket": {bucket: {"accuracy", "count"}}} of argmax predictions
  at the loss-mask positions. The bucket of an answer is the batch's ``answer_bucket`` (the
  generated kinds give it), else its key-query distance. predict_fn: tokens [batch, T] ->
  predictions [batch, T]. Padding rows (``valid`` = 0) are skipped."""
  hits, counts = {}, {}
  for batch in batches:
    predictions = np.asarray(predict_fn(batch["inputs"]))
    valid = batch.get("valid", np.ones(batch["inputs"].shape[0]))
    for row in np.flatnonzero(valid):
      positions = np.flatnonzero(batch["loss_mask"][row])
      if "answer_bucket" in batch:
        buckets = batch["answer_bucket"][row][positions]
      else:
        buckets = _query_distance_buckets(batch["inputs"][row], positions)
      right = predictions[row, positions] == batch["targets"][row, positions]
      for bucket, hit in zip(buckets, right):
        hits[int(bucket)] = hits.get(int(bucket), 0) + int(hit)
        counts[int(bucket)] = counts.get(int(bucket), 0) + 1
  total = sum(counts.values())
  return {"accuracy": sum(hits.values()) / total if total else None, "count": total,
          "by_bucket": {str(b): {"accuracy": hits[b] / counts[b], "count": counts[b]} for b in sorted(counts)}}


def recall_by_distance(predict_fn, batches):
  """MQAR: {bucket: {"accuracy", "count"}}; bucket "2^k" holds key-query distances in
  [2^k, 2^(k+1))."""
  return answer_accuracy(predict_fn, batches)["by_bucket"]
