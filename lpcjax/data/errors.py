from lpcjax.errors import UserError


class DataError(UserError, ValueError):
  """Data that cannot be used as configured: a missing file, too few tokens, a bad tokenizer."""
