"""Small file helpers shared by the trainer and the benchmark scripts."""

import json
import os


def write_json_atomic(path, obj):
  """Write obj as JSON to path via a temporary file and a rename: readers (and a run killed
  mid-write) see the old file or the new one, never half of one. Creates the parent folder."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
