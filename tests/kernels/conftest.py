import jax
import pytest


@pytest.fixture
def x64():
  """jax_enable_x64 on for one test (a user's codebase may set it): Python ints then trace as
  int64, which once broke the Pallas kernels where they met int32 program ids."""
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  yield
  jax.config.update("jax_enable_x64", previous)
