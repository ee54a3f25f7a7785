"""What every command line shares (train.py, eval.py, ``python -m lpcjax.generate``,
``python -m lpcjax.convert``, ``python -m lpcjax.data``): a known error ends in one line.

Standard library only, so that an entry point can use it before JAX is imported.
"""

import os
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


def help_text(doc, checkout_command, console_script):
  """A command's ``--help`` text ``doc``, its examples written as ``checkout_command`` (``python
  train.py``) given as ``console_script`` (``lpcjax-train``) when that is how it was started, so
  that every example works from an installed wheel too."""
  if os.path.basename(sys.argv[0] if sys.argv else "") != console_script:
    return doc
  # only the example lines (indented, starting with the command): the first line names both
  return "\n".join(line.replace(checkout_command, console_script, 1) if line.lstrip().startswith(checkout_command)
                   and line.startswith("  ") else line for line in doc.split("\n"))


_teardown_prints_noise = False


def skip_teardown():
  """Say that this process's teardown would print pages of noise after its one-line error: a
  checkpoint restore failed on unreadable files, and the reads TensorStore had started end
  during the interpreter's teardown, each printing a traceback that no hook can hold back
  then. ``finish`` then ends the process at once (lpcjax.training.checkpoint calls this)."""
  global _teardown_prints_noise
  _teardown_prints_noise = True


def finish(code):
  """An entry point's end: ``sys.exit(code)``, or, after ``skip_teardown``, the same status
  without the interpreter's teardown (output flushed first; nothing is being written then)."""
  if _teardown_prints_noise:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  sys.exit(code)
