"""distinctcap: make image captioners say what is distinctive (UNKT, CL, SMILE, specificity).

Each stage file adds its final outputs to ALL_TARGETS; `rule all` asks for all of them.
"""

import sys
from pathlib import Path

from snakemake.utils import min_version

from distinctcap.core.configfile import read_yaml
from distinctcap.core.errors import DistinctcapError
from distinctcap.runs.experiments import record_experiment

min_version("9.0")

# A YAML syntax error in config.yaml, named with its line before Snakemake's own message (which
# names neither file nor line). Snakemake reads --configfile files before this file runs:
# `distinctcap check-config FILE...` names the line of an error in those (docs/configuration.md).
try:
    if Path(f"{workflow.basedir}/config.yaml").exists():
        read_yaml(f"{workflow.basedir}/config.yaml")
except DistinctcapError as error:
    sys.stderr.write(f"distinctcap: config error: {error}\n")
    sys.exit(1)


# beside this file, so `snakemake --directory DIR` (one folder per experiment) still reads it
configfile: f"{workflow.basedir}/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/judge.smk"
include: "workflow/rules/entropy.smk"
include: "workflow/rules/neighbours.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/times.smk"


# the report's front page: what was run, the headline table, how to read it (common.smk)
report: report_front_page()


onstart:
    # runs after the DAG is built, before the first job (not for dry runs)
    require_java(workflow.dag.needrun_jobs())
    # the experiment folder remembers its config files and overrides (make run / make report)
    record_experiment(
        Path("."),
        Path(workflow.basedir),
        workflow.config_settings.configfiles,
        workflow.config_settings.config,
    )


rule all:
    default_target: True
    input:
        reported_targets(ALL_TARGETS),
