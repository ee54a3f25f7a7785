"""A damaged or incomplete checkpoint step is one line in each of the three commands (eval.py,
``python -m lpcjax.generate``, ``train.py --resume``): what is wrong, which step, what to do
(the previous step whose files look whole, and the flag that takes it); exit 2; no file of the
run changed. ``train.resume_step`` then continues that earlier step, with the damaged one set
aside, never deleted and never silently replaced by a run from scratch.

Each case damages one part of a real Orbax step of a run trained by train.py (checkpoints at
steps 2 and 4): its data files deleted or cut short, the state's ``_METADATA`` deleted or garbled
(the tree a restore reads first), and a half-written step."""

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, cli, tiny_arguments

STEPS = ["train.steps=4", "train.checkpoint_every=2", "train.warmup_steps=1", "train.eval_batches=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A run with checkpoints at steps 2 and 4, trained once for the module."""
  folder = tmp_path_factory.mktemp("damaged")
  assert cli("train")(tiny_arguments(folder, *STEPS, name="run")) == 0
  return folder


def digest(folder):
  """{relative path: sha256} of every file under ``folder``."""
  out = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      out[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
  return out


def data_files(step_dir):
  """The state's array files (OCDBT data), largest first."""
  files = [os.path.join(root, name) for root, _, names in os.walk(step_dir / "state")
           for name in names if os.path.basename(root) == "d"]
  return sorted(files, key=os.path.getsize, reverse=True)


def delete_the_data_files(step_dir):
  for path in data_files(step_dir):
    os.remove(path)


def truncate_the_data_files(step_dir):
  for path in data_files(step_dir):
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)


def delete_the_metadata(step_dir):
  os.remove(step_dir / "state" / "_METADATA")


def garble_the_params_tree(step_dir):
  path = step_dir / "state" / "_METADATA"
  text = path.read_text()
  path.write_text(text[:len(text) // 2])


# (Which OCDBT file holds which array is Orbax's business: every data file is damaged, so that
# the parameters, which evaluation reads, are too.)
DAMAGES = {"data files deleted": (delete_the_data_files, "cannot read"),
           "data files cut short": (truncate_the_data_files, "cannot read"),
           "_METADATA deleted": (delete_the_metadata, "its state has no _METADATA"),
           "the params tree garbled": (garble_the_params_tree, "damaged")}


@pytest.fixture
def run(trained, tmp_path):
  """A fresh copy of the trained run, to damage."""
  shutil.copytree(trained / "run", tmp_path / "run")
  return tmp_path / "run"


def one_line_refusal(capsys, code, *must):
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1, err
  for text in must:
    assert text in err[0], err[0]
  return err[0]


def generate(run_dir, *extra):
  from lpcjax.generate import main
  return main(["--run", str(run_dir), "--token-ids", "1,2,3", "--max-new-tokens", "2", *extra])


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_step_is_one_line_in_eval_and_generate_and_nothing_changes(damage, run, capsys):
  damage_fn, what = DAMAGES[damage]
  damage_fn(run / "checkpoints" / "4")
  before = digest(run)
  capsys.readouterr()
  advice = ("step 4", what, "--step 2", "train.resume_step=2", "no file was changed")
  line = one_line_refusal(capsys, cli("eval")(["--run", str(run), "--out", str(run.parent / "eval")]), *advice)
  assert line.startswith(f"error: {run}: checkpoint step 4 is damaged")
  one_line_refusal(capsys, generate(run), *advice)
  assert digest(run) == before and not (run.parent / "eval").exists()
  # the step offered works
  assert generate(run, "--step", "2") == 0


@pytest.mark.parametrize("damage", ["data files cut short", "_METADATA deleted"])
def test_resume_refuses_a_damaged_latest_step_then_continues_the_previous_one(damage, run, capsys):
  DAMAGES[damage][0](run / "checkpoints" / "4")
  before = digest(run)
  capsys.readouterr()
  train = cli("train")
  resume = [*tiny_arguments(run.parent, *STEPS, "train.steps=6", name="run"), "--resume"]
  one_line_refusal(capsys, train(resume), "step 4", "train.resume_step=2")
  assert digest(run) == before  # not trained from scratch, nothing written or deleted

  assert train([*resume, "train.resume_step=2"]) == 0
  out, err = capsys.readouterr()
  assert "train.resume_step" not in out  # the printed resume command continues the latest step
  assert f"later steps 4 moved to {run / 'checkpoints_set_aside'}" in err
  assert sorted(os.listdir(run / "checkpoints")) == ["2", "4", "6"]  # 4 and 6 saved again
  kept = run / "checkpoints_set_aside" / "4"
  assert digest(kept) == {path[len("checkpoints/4/"):]: value for path, value in before.items()
                          if path.startswith("checkpoints/4/")}


def test_in_a_process_of_its_own_the_line_is_all_it_prints(run):
  """The reads a failed restore had started end later, on TensorStore's threads and in the
  interpreter's teardown; each used to print a page of traceback (15 of them for --resume)."""
  truncate_the_data_files(run / "checkpoints" / "4")
  done = subprocess.run([sys.executable, str(REPO / "eval.py"), "--run", str(run)], capture_output=True, text=True,
                        cwd=run.parent)
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
  assert "checkpoint step 4 is damaged: cannot read" in done.stderr


def test_a_half_written_step_is_one_line_and_the_whole_one_is_offered(run, capsys):
  """A copy cut off in the middle: step 6 has its state's folder but none of its metadata."""
  half = run / "checkpoints" / "6"
  shutil.copytree(run / "checkpoints" / "4" / "state" / "d", half / "state" / "d")
  before = digest(run)
  capsys.readouterr()
  one_line_refusal(capsys, cli("eval")(["--run", str(run)]), "step 6", "--step 4")
  one_line_refusal(capsys, generate(run), "step 6", "--step 4")
  assert digest(run) == before


def test_a_failed_resume_from_an_earlier_step_moves_nothing_and_offers_the_whole_later_one(run, capsys):
  truncate_the_data_files(run / "checkpoints" / "2")
  before = digest(run)
  capsys.readouterr()
  resume = [*tiny_arguments(run.parent, *STEPS, "train.steps=6", name="run"), "--resume", "train.resume_step=2"]
  line = one_line_refusal(capsys, cli("train")(resume), "step 2 is damaged", "no file was changed",
                          "The next step whose files look whole is 4", "train.init_from=RUN:4")
  assert len(line) < 600  # TensorStore's spec is left out
  assert digest(run) == before and not (run / "checkpoints_set_aside").exists()


def test_resume_step_needs_resume_and_an_existing_step(run, capsys):
  train = cli("train")
  base = tiny_arguments(run.parent, *STEPS, "train.steps=6", name="run")
  one_line_refusal(capsys, train([*base, "train.resume_step=2"]),
                   "train.resume_step: continues a run from one of its checkpoints; pass --resume")
  one_line_refusal(capsys, train([*base, "train.resume_step=3", "--resume"]),
                   "train.resume_step:", "has no checkpoint at step 3; it has 2, 4")


def test_after_a_failed_restore_a_late_reads_callback_on_its_closed_loop_is_let_through():
  """A late read may call the loop's original call_soon_threadsafe (taken before the guard) from
  TensorStore's thread, with no Python frame below it (here: a thread started from C by
  _thread); after a failed restore the closed loop's check lets that call through silently,
  while the same call from Python code still raises."""
  script = """
import _thread, asyncio, sys, time
from lpcjax.training import checkpoint
checkpoint._ClosedLoopGuard.install()  # a restore began
checkpoint._quiet_failed_reads()  # and failed: the guard stays
checkpoint._ClosedLoopGuard.remove()
loop = asyncio.new_event_loop()
loop.close()
call_soon_threadsafe = checkpoint._ClosedLoopGuard.original
_thread.start_new_thread(call_soon_threadsafe, (loop, print))
time.sleep(0.5)
print("main thread:", file=sys.stderr)
try:
  call_soon_threadsafe(loop, print)
except RuntimeError as error:
  print(error, file=sys.stderr)
"""
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
  assert done.returncode == 0, done.stderr
  from_thread, from_main = done.stderr.split("main thread:")
  assert from_thread.strip() == "" and from_main.strip() == "Event loop is closed"
