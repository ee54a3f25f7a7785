"""One writer per run directory (``lpcjax.training.run_lock``) and the file-system trouble a
trainer meets before it computes anything: each a one-line error, exit 2, no file changed."""

import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from lpcjax.training import train
from lpcjax.files import FileSystemError, filesystem_problem
from lpcjax.training.run_lock import LOCK_FILE, RunLock, RunLockedError

from conftest import REPO, tiny_arguments, tiny_experiment


def snapshot(folder):
  """Every file under ``folder`` with its size and modification time."""
  found = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      stat = os.stat(path)
      found[os.path.relpath(path, folder)] = (stat.st_size, stat.st_mtime_ns)
  return found


def run_train(*arguments, cwd, user=None):
  return subprocess.run([sys.executable, str(REPO / "train.py"), *arguments], capture_output=True, text=True,
                        cwd=cwd, env={**os.environ, "XLA_FLAGS": ""}, user=user)


def test_the_lock_names_its_holder_and_is_gone_once_released(tmp_path):
  with RunLock(str(tmp_path)) as first:
    first.acquire()
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(RunLockedError, match=rf"^{tmp_path} is being trained by process {os.getpid()} on "
                                             rf"{socket.gethostname()} \(started .*\): one trainer per run directory"):
      RunLock(str(tmp_path)).acquire()
  assert not (tmp_path / LOCK_FILE).exists()
  with RunLock(str(tmp_path)) as again:
    assert again.acquire().note() is None


def test_a_killed_trainers_lock_is_named_and_taken_over(tmp_path):
  """SIGKILL (the out-of-memory killer, a scheduler's hard stop) runs no cleanup: the file stays,
  its flock does not; the next trainer says whose it was and takes it."""
  holder = subprocess.run([sys.executable, "-c", (
      "import os, signal, sys; from lpcjax.training.run_lock import RunLock; "
      f"RunLock({str(tmp_path)!r}).acquire(); print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGKILL)")],
      capture_output=True, text=True)
  assert holder.returncode == -signal.SIGKILL
  dead = int(holder.stdout)
  assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == dead
  with RunLock(str(tmp_path)) as lock:
    assert lock.acquire().note().startswith(f"note: {tmp_path / LOCK_FILE} named process {dead} on ")
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_without_flock_the_file_is_the_lock(tmp_path, monkeypatch):
  """A file system that refuses flock (some FUSE and parallel ones): the file's existence locks;
  a dead process of this host is taken over, another host's holder is named with how to clear it."""
  def no_flock(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(fcntl, "flock", no_flock)
  with RunLock(str(tmp_path)) as first:
    first.acquire()
    with pytest.raises(RunLockedError, match=f"process {os.getpid()} on"):
      RunLock(str(tmp_path)).acquire()
  assert not (tmp_path / LOCK_FILE).exists()
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  (tmp_path / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout),
                                                "started": "then", "command": "train.py"}))
  with RunLock(str(tmp_path)) as lock:
    assert f"process {int(gone.stdout)} on" in lock.acquire().note()
  (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 7, "started": "then", "command": "x"}))
  with pytest.raises(RunLockedError, match=f"process 7 on elsewhere .* remove {tmp_path / LOCK_FILE} and start again$"):
    RunLock(str(tmp_path)).acquire()


def test_a_second_trainer_exits_2_with_one_line_and_changes_nothing(tmp_path, monkeypatch):
  """A trainer holds the run (this test's process, as a running train.py would): another
  train.py on it, new or resumed, stops before it writes; train() in-process says the same."""
  arguments = tiny_arguments(tmp_path, "train.steps=2", "train.warmup_steps=0", "train.eval_batches=1", name="held")
  run_dir = tmp_path / "held"
  train(tiny_experiment(tmp_path, "train.steps=2", "train.warmup_steps=0", "train.eval_batches=1", name="held"),
        progress=False)
  with RunLock(str(run_dir)) as lock:
    lock.acquire()
    before = snapshot(run_dir)
    for extra in (["train.steps=4", "--resume"], ["train.steps=4", "model.num_layers=3", "--resume-or-start"]):
      result = run_train(*arguments, *extra, cwd=tmp_path)
      assert result.returncode == 2, result.stderr
      assert result.stderr.strip().splitlines() == [
          f"error: {run_dir} is being trained by process {os.getpid()} on {socket.gethostname()} "
          + result.stderr.split(f"{socket.gethostname()} ", 1)[1].strip()]
      assert "one trainer per run directory" in result.stderr and result.stdout == ""
    assert snapshot(run_dir) == before
    from lpcjax.runs import load_run
    assert load_run(str(run_dir)).step == 2  # readers (eval.py, generate) never wait for the lock
  # Two trainers start a new run at once: both find no folder, this one makes it, and the other
  # holds it before this one's lock (its acquire fails): the folder is the other's, kept.
  def held_by_another(lock):
    raise RunLockedError(f"{lock.run_dir} is being trained by another process")

  monkeypatch.setattr(RunLock, "acquire", held_by_another)
  with pytest.raises(RunLockedError):
    train(tiny_experiment(tmp_path, "train.steps=2", "train.warmup_steps=0", name="fresh"), progress=False)
  assert os.path.isdir(tmp_path / "fresh")  # made by this call, but not its to remove


def test_a_lock_the_disk_cannot_take_is_one_line(tmp_path, monkeypatch):
  """Writing the holder's name into train.lock fails (a full disk): one line naming the reason,
  and nothing left behind: no lock file, no run folder."""
  def full(fd, data, offset):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "pwrite", full)
  with pytest.raises(FileSystemError, match=r"no space left on the device; choose a writable folder"):
    train(tiny_experiment(tmp_path, "train.steps=2", "train.warmup_steps=0", name="full"), progress=False)
  assert not os.path.exists(tmp_path / "full")


def test_a_run_directory_that_cannot_be_written_is_one_line_before_any_compute(tmp_path):
  """A file where the run folder (or one above it) should be, and a folder without write
  permission (as a user without root's override meets it; as root, a folder made immutable with
  chattr +i, which stops root too)."""
  (tmp_path / "file").write_text("not a folder")
  result = run_train("train.steps=1", "train.warmup_steps=0", f"train.run_dir={tmp_path / 'file'}",
                     "train.run_name=r", cwd=tmp_path)
  assert result.returncode == 2
  assert result.stderr.strip() == (f"error: cannot write {tmp_path / 'file' / 'r'}: a file stands where a folder is "
                                   "needed; choose a writable folder with train.run_dir=PATH")
  assert (tmp_path / "file").read_text() == "not a folder"

  locked = tmp_path / "runs"
  locked.mkdir()
  with unwritable(locked):
    result = run_train("train.steps=1", "train.warmup_steps=0", f"train.run_dir={locked}", "train.run_name=r",
                       cwd=tmp_path)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip() == (f"error: cannot write {locked / 'r'}: no permission to write there; choose a "
                                   "writable folder with train.run_dir=PATH")
  assert os.listdir(locked) == []


@contextlib.contextmanager
def unwritable(folder):
  """``folder`` without write permission while the block runs: chmod for a user; for root, whom
  permissions do not stop, the immutable attribute (chattr +i), else the test skips."""
  if os.geteuid() != 0:
    os.chmod(folder, 0o555)
    try:
      yield
    finally:
      os.chmod(folder, 0o755)
    return
  if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
    pytest.skip("root, and this file system has no immutable attribute: nothing here is unwritable to root")
  try:
    yield
  finally:
    subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_filesystem_problem_names_the_reason():
  full = OSError(errno.ENOSPC, "No space left on device", "/runs/r/checkpoints")
  problem = filesystem_problem(full, "/runs/r", "free some")
  assert isinstance(problem, FileSystemError) and isinstance(problem, OSError)
  assert str(problem) == "cannot write /runs/r/checkpoints: no space left on the device; free some"


def test_a_run_that_lost_config_json_evaluates_and_resumes(tmp_path, capsys):
  """Each checkpoint carries the config: eval (load_run) and --resume read it, with a note, and
  the resumed run writes config.json again; paths that are no run directory say what they are."""
  from lpcjax.runs import RunError, load_run, read_config
  cfg = tiny_experiment(tmp_path, "train.steps=2", "train.warmup_steps=0", "train.eval_batches=1", name="lost")
  run_dir, _ = train(cfg, progress=False)
  os.remove(os.path.join(run_dir, "config.json"))
  assert read_config(run_dir) == cfg
  assert capsys.readouterr().err.strip() == (f"warning: {run_dir} has no config.json: using the config saved with "
                                             "checkpoint step 2 (a resumed run writes config.json again)")
  assert load_run(run_dir).step == 2
  from lpcjax import experiment
  train(experiment.apply_overrides(cfg, ["train.steps=3"]), resume=True, progress=False)
  assert experiment.from_dict(json.load(open(os.path.join(run_dir, "config.json")))) == cfg
  with pytest.raises(RunError, match=r"config.json is a file, not a run directory; its folder .*lost is the run"):
    read_config(os.path.join(run_dir, "config.json"))
  with pytest.raises(RunError, match=r"nowhere: no such folder"):
    read_config(str(tmp_path / "nowhere"))
  with pytest.raises(RunError, match=r"checkpoints: not a run directory \(no config.json, no checkpoint\)$"):
    read_config(os.path.join(run_dir, "checkpoints"))
  import shutil
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "3", "config"))  # as a step of lpcjax before the copy
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "2", "config"))
  os.remove(os.path.join(run_dir, "config.json"))
  with pytest.raises(RunError, match=r"carry none: write it again with the command that started the run, plus "
                                     r"--print-config > .*lost/config.json$"):
    read_config(run_dir)


def test_eval_checks_its_output_folder_before_it_evaluates(tmp_path):
  run_dir, _ = train(tiny_experiment(tmp_path, "train.steps=1", "train.warmup_steps=0", "train.eval_batches=1"),
                     progress=False)
  with unwritable(run_dir):
    result = subprocess.run([sys.executable, str(REPO / "eval.py"), "--run", run_dir], capture_output=True, text=True,
                            cwd=tmp_path, env={**os.environ, "XLA_FLAGS": ""})
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr.strip() == (f"error: cannot write {run_dir}/eval: no permission to write there; choose another "
                                   "folder with --out DIR")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a file that is always full")
def test_a_full_disk_under_the_metrics_log_ends_the_run_in_one_line(tmp_path):
  """The metrics log met a full disk (CI: after a checkpoint that fitted) and the run ended in a
  traceback, then a second one from closing the file: now one line naming the file and the way out."""
  from lpcjax.training.run_directory import MetricsLog
  log = MetricsLog(str(tmp_path), tensorboard=False, start=0)
  log.file.close()
  log.file = open("/dev/full", "a")  # every flush: ENOSPC
  with pytest.raises(FileSystemError) as error:
    log.write({"step": 1, "loss": 1.0})
  assert str(error.value) == (f"cannot write {tmp_path}/metrics.jsonl: no space left on the device; the checkpoints "
                              "saved so far stay whole: make room, then resume the run (--resume)")
  log.close()  # nothing left to fail


def test_a_disk_that_fills_during_a_checkpoint_keeps_the_steps_before_it(tmp_path):
  """A 1.4 MB file system (tmpfs, mounted by root) holds two checkpoints of the tiny model and
  not a third (or its metrics log meets the full disk first, after a checkpoint that fitted):
  one line, exit 2, no partial step, the earlier steps whole; with room made, --resume finishes
  the run from them."""
  mount = tmp_path / "small"
  mount.mkdir()
  if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1400k", "tmpfs", str(mount)],
                                         capture_output=True).returncode != 0:
    pytest.skip("needs root and mount, for a small file system")
  try:
    arguments = tiny_arguments(mount, "train.steps=8", "train.warmup_steps=0", "train.eval_batches=1",
                               "train.checkpoint_every=2", "train.keep_checkpoints=5", name="r")
    result = run_train(*arguments, cwd=tmp_path)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("fox_tiny_mqar step")]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    found = re.fullmatch(rf"error: checkpoint step (\d+) could not be written to {mount}/r/checkpoints \(no space "
                         r"left on the device\); its partial folder was removed and the steps before it stay whole "
                         r"\(([\d, ]+)\): make room, then resume the run \(--resume\)", lines[0])
    # or the metrics log met the full disk first, after a checkpoint that fitted
    log_full = (f"error: cannot write {mount}/r/metrics.jsonl: no space left on the device; the checkpoints saved "
                "so far stay whole: make room, then resume the run (--resume)")
    assert found or lines[0] == log_full, lines[0]
    steps = os.listdir(mount / "r" / "checkpoints")
    assert all(step.isdigit() for step in steps) and steps, steps  # no partial folder
    if found:
      whole = found[2].split(", ")
      assert sorted(steps, key=int) == whole and int(whole[-1]) < int(found[1])
    subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True)
    result = run_train(*arguments, "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(mount / "r" / "checkpoints")) == ["2", "4", "6", "8"]
  finally:
    subprocess.run(["umount", str(mount)], check=True)
