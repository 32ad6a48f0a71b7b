"""`python -m distinctcap`: the `distinctcap` command (distinctcap.runs.cli)."""

import sys

from distinctcap.runs.cli import main

sys.exit(main())
