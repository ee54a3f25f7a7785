"""model.attention_impl=triton in the models: cached decoding (prefill and the full forward run
the kernels, the decode steps the cache) equals the full forward, and the config override picks
it. Gradients, remat and shard_map are checked on the op (tests/kernels/test_triton_kernels.py).
The kernels run under the Triton interpreter (tests/triton_interpreted.py); skipped where torch
or triton is not installed."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import test_generation  # noqa: E402
import triton_interpreted  # noqa: E402
from lpcjax import experiment as C  # noqa: E402
from lpcjax.kernels import triton_backend  # noqa: E402


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
  monkeypatch.setattr(triton_backend, "launcher", triton_interpreted.interpreted_launcher())


def test_cached_decoding_with_triton_prefill():
  test_generation.test_decode_steps_equal_full_forward("fox", "llama", "triton", None)


def test_config_override_selects_triton(repo_root):
  cfg = C.apply_overrides(C.load_experiment(str(repo_root / "configs" / "fox_tiny_mqar.py")),
                          ["model.attention_impl=triton"])
  assert cfg.model.attention_impl == "triton"
