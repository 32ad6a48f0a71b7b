"""Config validation, wildcard constraints and input functions shared by every stage."""

import sys
from pathlib import Path

from distinctcap.config import load_schema, validate
from distinctcap.errors import DistinctcapError

SCHEMA = Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"

try:
    config = validate(config, load_schema(SCHEMA))
except DistinctcapError as error:
    sys.stderr.write(f"distinctcap: config error: {error}\n")
    sys.exit(1)

DATA = "results/data"
ALL_TARGETS = []  # each stage file appends its final outputs
