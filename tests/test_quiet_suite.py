"""The test suite's own settings (pyproject.toml): a test that leaves an exception Python can
only print ("Exception ignored in ...": a __del__, a gc callback, an unclosed async reader)
fails, so a green run never hides a page of tracebacks; the swallowed-Ctrl-C helper leaves none."""

import subprocess
import sys

from conftest import REPO

LEAKY = '''
import gc

class Leaky:
  def __del__(self):
    raise RuntimeError("Event loop is closed")

def test_leaves_an_unraisable_exception():
  Leaky()
  gc.collect()
'''

HELPER = '''
import gc
from hypothesis.internal.conjecture.junkdrawer import gc_cumulative_time
from conftest import ctrl_c_swallowed_by_the_interpreter
from lpcjax import interrupts

def test_the_swallowed_ctrl_c_stays_inside_its_block():
  gc_cumulative_time()  # hypothesis' gc callback, installed as the kernel tests install it
  gc.set_threshold(1)  # a collection at every chance: where the interrupt used to leak
  try:
    for _ in range(50):
      with interrupts.remembered():
        garbage = [[] for _ in range(10)]
        ctrl_c_swallowed_by_the_interpreter()
        garbage = [[] for _ in range(10)]
        assert interrupts.requested()
      assert not interrupts.requested()
  finally:
    gc.set_threshold(700, 10, 10)
'''


def run_pytest(tmp_path, source):
  test = tmp_path / "test_probe.py"
  test.write_text(source)
  # The repository's pytest settings (-c), the test file outside tests/ (no xdist, one file).
  return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                         str(REPO / "pyproject.toml"), f"--rootdir={tmp_path}", str(test)],
                        capture_output=True, text=True, cwd=tmp_path,
                        env={"PYTHONPATH": str(REPO / "tests"), "PATH": "/usr/bin:/bin"})


def test_an_exception_python_only_prints_fails_the_test(tmp_path):
  result = run_pytest(tmp_path, LEAKY)
  assert result.returncode == 1, result.stdout + result.stderr
  assert "1 failed" in result.stdout and "Event loop is closed" in result.stdout


def test_the_swallowed_ctrl_c_helper_leaks_into_no_gc_callback(tmp_path):
  result = run_pytest(tmp_path, HELPER)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "1 passed" in result.stdout and "Warning" not in result.stdout
