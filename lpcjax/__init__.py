"""lpcjax: a JAX/Flax model zoo for long-context sequence models."""

__version__ = "0.1.0"
