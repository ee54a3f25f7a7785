import os
import pathlib

# Eight virtual CPU devices for the multi-device tests; must be set before JAX starts.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data():
  """../shared/data beside the checkout; tests that need it skip in a user's fresh clone."""
  if not SHARED_DATA.is_dir():
    pytest.skip("../shared/data is not present")
  return SHARED_DATA


@pytest.fixture
def repo_root():
  return REPO


os.environ.setdefault("TQDM_DISABLE", "1")
