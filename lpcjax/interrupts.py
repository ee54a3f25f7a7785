"""Ctrl-C while a program starts up (imports, data, compilation): remembered, never lost.

Python turns SIGINT into a KeyboardInterrupt wherever the interpreter happens to be. When that
is a garbage-collection callback or a ``__del__`` (JAX runs one on every collection), Python
prints "Exception ignored in ..." with a traceback and carries on as if nothing had been asked.
``catch_startup_interrupts`` makes the request stick: the handler records it before raising,
and a KeyboardInterrupt swallowed that way is not printed. The trainer's own stop handling
(``lpcjax.training.loop.stop_requests``) reads the record, so a request that was swallowed still
stops the run before its first step. Standard library only: it is installed before JAX is
imported.
"""

import signal
import sys

_requested = False


def requested():
  """Whether SIGINT arrived since ``catch_startup_interrupts``."""
  return _requested


def catch_startup_interrupts():
  """From now on SIGINT records a stop request and raises KeyboardInterrupt (main thread only)."""

  def handler(signum, frame):
    global _requested
    _requested = True
    raise KeyboardInterrupt

  previous_hook = sys.unraisablehook

  def unraisable(info):
    if _requested and issubclass(info.exc_type, KeyboardInterrupt):
      return  # swallowed by a callback, but recorded: the trainer stops on it
    previous_hook(info)

  global _requested
  _requested = False
  signal.signal(signal.SIGINT, handler)
  sys.unraisablehook = unraisable
