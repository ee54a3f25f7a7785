"""``python -m lpcjax.data OUT_PREFIX INPUT ...``: prepare a token file (see prepare.py)."""

import sys

from .prepare import main

sys.exit(main())
