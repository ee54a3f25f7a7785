"""The one error base of lpcjax, on the ground floor (imports nothing).

Every error that describes a problem with what the user asked for (a config field, a data file,
a run directory, a checkpoint to convert, a generation request) derives from ``UserError``.
The command lines (train.py, eval.py, ``python -m lpcjax.generate|convert|data``) turn exactly
these into one line on stderr and exit status 2 (``lpcjax.cli.one_line_errors``); anything
else is a bug and keeps its traceback.
"""


class UserError(Exception):
  """A request that cannot be carried out as given; its message is the whole explanation."""


class ConfigError(UserError, ValueError):
  """A config field is unknown, has the wrong type, or conflicts with another field."""


class RunError(UserError, ValueError):
  """A run directory that cannot be read: not there, no config.json, no checkpoint, no such step."""


def warn(message):
  """One line on stderr for a request carried out, but not quite as given (a cue gap that does
  not fit, a series cut to the training length): visible, and never a traceback."""
  import sys  # standard library; keeps this module's top free of imports
  print(f"warning: {message}", file=sys.stderr)
