"""One writer per run directory: a trainer holds RUN/train.lock for as long as it runs.

Two trainers writing one run directory interleave checkpoints of different models under one
config.json and drop each other's metrics rows, and both exit 0. The lock makes the second one
stop before it writes anything, with one line naming the holder.

How it holds: the file is opened (created if absent) and locked with ``flock``, then the holder
(host, process id, start time, command) is written into it. The operating system releases an
``flock`` when its process ends, however it ends, so a trainer killed with SIGKILL or by the
out-of-memory killer leaves no lock behind: the next trainer finds the file unlocked, says whose
it was, and takes it (a scheduler that restarts a killed job with --resume needs no hand). A
trainer that ends normally removes the file. Readers (eval.py, generate) never take it.

Where the file system has no ``flock`` (some FUSE and parallel file systems refuse it), the
file's existence is the lock (created with O_EXCL): a file naming a process of this host that
is gone is named and taken over; one naming another host cannot be checked from here, and the
error says how to clear it. On file systems mounted without cross-host locking (NFS ``nolock``)
``flock`` guards only the trainers of one host.

Standard library only.
"""

import fcntl
import json
import os
import socket
import sys
import time

from lpcjax.errors import UserError
from lpcjax.files import filesystem_problem

LOCK_FILE = "train.lock"


class RunLockedError(UserError, RuntimeError):
  """Another trainer holds the run directory."""


def _holder():
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}


def _describe(holder):
  if not holder:
    return "another process (it has not written its name yet)"
  return (f"process {holder.get('pid')} on {holder.get('host')} (started {holder.get('started')}: "
          f"{holder.get('command')})")


def _read(fd):
  try:
    text = os.pread(fd, 4096, 0).decode(errors="replace")
    return json.loads(text) if text.strip() else None
  except (OSError, ValueError):
    return {"pid": "?", "host": "?", "started": "?", "command": "an unreadable train.lock"}


def _read_file(path):
  try:
    fd = os.open(path, os.O_RDONLY)
  except FileNotFoundError:
    return None
  try:
    return _read(fd)
  finally:
    os.close(fd)


def _alive_here(holder):
  """Whether ``holder`` is a live process of this host (False: gone; None: another host)."""
  if not holder or holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
    return None
  try:
    os.kill(holder["pid"], 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, another user's
    return True
  return True


class RunLock:
  """``acquire()`` holds ``run_dir`` (which must exist) or raises RunLockedError naming the
  holder; ``release()`` (or the end of a ``with`` block) lets it go (twice is harmless).
  ``taken_over``: the holder a dead trainer left in the file, when this lock took it over (None
  otherwise)."""

  def __init__(self, run_dir):
    self.run_dir, self.path = run_dir, os.path.join(run_dir, LOCK_FILE)
    self.fd, self.taken_over = None, None

  def acquire(self):
    for _ in range(20):  # another trainer may remove the file between our open and our lock
      fd, created = self._open()
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise self._locked(holder) from None
      except OSError:  # this file system has no flock: the file's existence is the lock
        if created:  # made by this open (O_EXCL): ours
          return self._hold(fd, taken_over=None)
        os.close(fd)
        return self._take_if_stale()
      if self._same_file(fd):
        return self._hold(fd, taken_over=_read(fd))  # a holder that ended without removing the file
      os.close(fd)  # we locked a file its holder had just removed: try the new one
    raise RunLockedError(f"{self.path}: cannot be held, trainers keep replacing it")

  def _open(self):
    """(descriptor, whether this call created the file)."""
    try:
      try:
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
      except FileExistsError:
        return os.open(self.path, os.O_RDWR), False
    except OSError as error:
      raise filesystem_problem(error, self.run_dir, "choose a writable folder with train.run_dir=PATH") from None

  def _same_file(self, fd):
    try:
      return os.path.samestat(os.fstat(fd), os.stat(self.path))
    except FileNotFoundError:
      return False

  def _take_if_stale(self):
    """Without flock: remove the file of a trainer of this host that is gone, then take it. Its
    holder is read through one descriptor, and the file is removed only if it is still that one
    (another trainer may have taken it over meanwhile); a race remains between that check and
    the removal, which only flock closes (docs/training.md)."""
    try:
      fd = os.open(self.path, os.O_RDONLY)
    except FileNotFoundError:  # its holder ended, or another trainer is taking it over, meanwhile
      raise self._locked(None) from None
    try:
      holder = _read(fd)
      alive = _alive_here(holder)
      if alive is not False:
        raise self._locked(holder, can_check=alive is not None)
      if not self._same_file(fd):
        raise self._locked(_read_file(self.path))
      os.unlink(self.path)  # a process of this host that is gone: its lock is stale
    finally:
      os.close(fd)
    fd, created = self._open()
    if not created:  # another trainer took it between the two calls
      os.close(fd)
      raise self._locked(_read_file(self.path))
    return self._hold(fd, taken_over=holder)

  def _hold(self, fd, taken_over):
    self.fd, self.taken_over = fd, taken_over
    text = json.dumps(_holder()).encode()
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, text, 0)
    except OSError:  # a full disk, say: let go, and the caller says why in one line
      self.release()
      raise
    return self

  def _locked(self, holder, can_check=True):
    unsure = "" if can_check else (f"; if that process is gone (this host cannot check another's), remove "
                                   f"{self.path} and start again")
    return RunLockedError(f"{self.run_dir} is being trained by {_describe(holder)}: one trainer per run "
                          f"directory; wait for it to end or stop it, or choose another train.run_name{unsure}")

  @property
  def held(self):
    return self.fd is not None

  def note(self):
    """The line to print after taking over a dead trainer's lock, or None."""
    if not self.taken_over:
      return None
    return f"note: {self.path} named {_describe(self.taken_over)}, which ended without releasing it; taken over"

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.release()

  def release(self):
    if self.fd is None:
      return
    fd, self.fd = self.fd, None
    try:
      if self._same_file(fd):  # still ours (a failed new run's folder may be gone already)
        os.unlink(self.path)
    finally:
      os.close(fd)  # releases the flock
