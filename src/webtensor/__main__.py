"""`python -m webtensor`: the `webtensor` command."""

import sys

from .cli import main

sys.exit(main())
