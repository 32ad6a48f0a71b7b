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


# --- Runs: training and decoding (train.smk, decode.smk) -------------------------------------
import re

from distinctcap.config import effective_run_config

RUNS = config["runs"]
DECODING = config["decoding"]
RUN_DIR = "results/runs"
FEATURES_INDEX = "results/features/index.json"  # extract_features (features.smk)
ENTROPY_SUBSETS = {"D-": "results/entropy/D-", "D+": "results/entropy/D+"}  # split_entropy
try:  # every run's effective block, checked now so a bad override fails before any job runs
    RUN_CONFIGS = {
        name: effective_run_config(config, name, load_schema(SCHEMA)) for name in RUNS
    }
except DistinctcapError as error:
    sys.stderr.write(f"distinctcap: config error: {error}\n")
    sys.exit(1)


def _choice(names):
    """Wildcard pattern matching exactly one of `names` (never empty)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


wildcard_constraints:
    run=_choice(RUNS),
    decoding=_choice(DECODING),
    split="val|test",


# Extra files (and non-file settings) a method needs, as entries of the trainer's
# cfg["paths"]: method -> function(run block) -> dict. A new method registers here.
METHOD_INPUTS = {
    "unkt": lambda run: (
        {"d_minus": ENTROPY_SUBSETS["D-"]} if run.get("targets") == "random" else {}
    ),
    "specificity": lambda run: (
        ({"clip": TRAINED_CLIP} if TRAIN_CLIP else {"clip_files": CLIP_FILES})
        | (
            {"neighbours": neighbours_table(run.get("contrastive_top_pct", 1))}
            if run.get("loss", "ccos") in ("cdp", "ccos")
            else {}
        )
    ),
}
METHOD_PATHS = {
    "specificity": lambda run: {"clip_arch": config["clip"]["arch"]}
    | ({} if TRAIN_CLIP else {"clip": config["clip"]["pretrained"]}),
}


def neighbours_table(pct):
    from distinctcap.neighbours import table_path

    return table_path(pct)


def run_model(name):
    return f"{RUN_DIR}/{name}/model.pt"


def train_inputs(wildcards):
    """Files run {run} reads: data tables, image features, its subset shards (D- / D+), the
    final models of its init / teacher / reference runs, and what its method needs."""
    run = RUNS[wildcards.run]
    inputs = {
        "captions": f"{DATA}/captions.parquet",
        "vocab": f"{DATA}/vocab.json",
        "features": FEATURES_INDEX,
    }
    if run.get("data", "all") != "all":
        inputs["subset"] = ENTROPY_SUBSETS[run["data"]]
    for edge in ("init", "teacher", "reference"):
        if run.get(edge):
            inputs[edge] = run_model(run[edge])
    extra = METHOD_INPUTS.get(run["method"], lambda run: {})(run)
    return inputs | {k: v for k, v in extra.items() if v}


def train_paths(wildcards):
    """Non-file entries of the trainer's cfg["paths"] (e.g. a CLIP tag and architecture)."""
    run = RUNS[wildcards.run]
    return METHOD_PATHS.get(run["method"], lambda run: {})(run)


def decode_targets():
    """Every run's captions under every decoding setting, for each setting's splits."""
    return [
        f"results/generated/{run}/{split}-{name}.parquet"
        for run in RUNS
        for name, setting in DECODING.items()
        for split in setting["splits"]
    ]


# --- Checks before the first job (the Snakefile's onstart) -----------------------------------

def require_java(jobs):
    """Stop before any job when one of `jobs` evaluates captions and `java` is missing: the
    COCO metrics need it, and otherwise it is found only after every training run finished."""
    from distinctcap.metrics.coco import check_java

    if any(job.rule.name == "evaluate" for job in jobs):
        try:
            check_java()
        except DistinctcapError as error:
            sys.stderr.write(f"distinctcap: {error}\n")
            sys.exit(1)
