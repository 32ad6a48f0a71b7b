"""`python -m distinctcap`: the `distinctcap` command (distinctcap.cli)."""

import sys

from distinctcap.cli import main

sys.exit(main())
