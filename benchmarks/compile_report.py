"""What the two compile checks share: triton_compile.py (the Pallas kernels, through XLA's Triton
pipeline; jaxlib 0.10.x) and triton_kernels_compile.py (impl="triton"'s kernels, through Triton's
own compiler): the --pair and --out options, ptxas's report of registers and spills, and the
JSON they end with.

A module of its own rather than one script with a mode: the two compile different kernels with
different tool chains at different JAX versions, and the docs run each by its name. It imports
no JAX: triton_compile.py puts the CUDA plugin on sys.path and sets JAX_PLATFORMS first.
"""

import os
import re
import subprocess
import sys
import tempfile

from lpcjax.files import write_json_atomic


def parse_args(parser, name):
  """``parser``'s arguments, with --pair (the launch variants) and --out (default:
  results/<name>_sm<arch digits>.json beside this file) added."""
  parser.add_argument("--pair", nargs="+", type=lambda x: x == "true", default=[False, True],
                      help="launch variants: false (one device), true (the ring's chunk pairs)")
  parser.add_argument("--out", help=f"default: results/{name}_sm<arch>.json")
  args = parser.parse_args()
  if args.out is None:
    arch = str(args.arch).replace(".", "")  # "9.0" (triton_compile.py) or 90 alike
    args.out = os.path.join(os.path.dirname(__file__), "results", f"{name}_sm{arch}.json")
  return args


def ptxas_report(ptxas, ptx, arch):
  """Registers and spill bytes from ``ptxas -v``, or {} without ptxas. arch: e.g. "9.0"."""
  if ptxas is None:
    return {}
  sm = "sm_" + arch.replace(".", "") + ("a" if arch == "9.0" else "")
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "kernel.ptx")
    with open(path, "w") as f:
      f.write(ptx)
    run = subprocess.run([ptxas, f"-arch={sm}", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
                         capture_output=True, text=True, check=False)
  if run.returncode:
    raise RuntimeError(f"ptxas failed: {run.stderr.strip().splitlines()[-1]}")
  number = lambda pattern: int(re.search(pattern, run.stderr).group(1))
  return {"registers": number(r"Used (\d+) registers"),
          "spill_store_bytes": number(r"(\d+) bytes spill stores"),
          "spill_load_bytes": number(r"(\d+) bytes spill loads")}


def write_report(path, header, rows):
  """The rows, after ``header``'s fields, as JSON at ``path``; then exit status 1 if a kernel's
  shared memory exceeds the per-block limit (a row's fits_smem False; None: not judged)."""
  write_json_atomic(path, {**header, "rows": rows})
  print(f"wrote {path}")
  if any(row["fits_smem"] is False for row in rows):
    sys.exit(1)
