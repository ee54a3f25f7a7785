"""What every command line shares (train.py, eval.py, ``python -m lpcjax.generate``,
``python -m lpcjax.convert``, ``python -m lpcjax.data``): a known error ends in one line.

Standard library only, so that an entry point can use it before JAX is imported.
"""

import sys

from lpcjax.errors import UserError

USAGE_ERROR = 2  # the exit status of a request that cannot be carried out as given


def exit_status(run, *also):
  """``run()``'s return value; a ``UserError`` (or an instance of one of ``also``) instead
  prints ``error: MESSAGE`` on stderr and returns USAGE_ERROR. Anything else is a bug and
  keeps its traceback."""
  try:
    return run()
  except (UserError, *also) as error:
    print(f"error: {error}", file=sys.stderr)
    return USAGE_ERROR
