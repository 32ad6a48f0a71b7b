"""distinctcap: make image captioners say what is distinctive (UNKT, CL, SMILE, specificity).

Each stage file adds its final outputs to ALL_TARGETS; `rule all` asks for all of them.
"""

from snakemake.utils import min_version

min_version("9.0")


# beside this file, so `snakemake --directory DIR` (one folder per experiment) still reads it
configfile: f"{workflow.basedir}/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/entropy.smk"
include: "workflow/rules/neighbours.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/times.smk"


# the report's front page: what was run, the headline table, how to read it (common.smk)
report: report_front_page()


onstart:
    # runs after the DAG is built, before the first job (not for dry runs)
    require_java(workflow.dag.needrun_jobs())


rule all:
    input:
        reported_targets(ALL_TARGETS),
    default_target: True
