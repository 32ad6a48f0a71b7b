"""Config validation, wildcard constraints and input functions shared by every stage.

Everything imported here (and by the other rule files) while Snakemake parses the workflow and
builds its DAG stays free of torch: config checks and method facts come from distinctcap.config
and distinctcap.methods.facts; the jobs' scripts import the heavy modules."""

import re
import sys
from pathlib import Path

from distinctcap.config.check import load_schema, validate
from distinctcap.config.priorities import entropy_priority, run_priorities
from distinctcap.config.rungraph import effective_run_config, seed_runs, selected_runs
from distinctcap.core.configfile import config_sources
from distinctcap.core.cores import features_threads, local_cores
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.params import Defaults, canonical_params, stage_version
from distinctcap.core.results import GENERATED_PATH, RUN_DIR
from distinctcap.core.settings import JudgeSettings
from distinctcap.methods.facts import FACTS, method_version
from distinctcap.runs.experiments import report_requested

SCHEMA = Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"

CONFIG_SCHEMA = load_schema(SCHEMA)
# config.yaml, then each --configfile, then --config: an error names the one that set the key
CONFIG_FILES = [Path(workflow.basedir) / "config.yaml", *workflow.config_settings.configfiles]
try:
    sources = config_sources(
        [f for f in CONFIG_FILES if Path(f).is_file()],
        workflow.config_settings.config,
        Path(workflow.basedir),
    )
    config = validate(config, CONFIG_SCHEMA, sources)
    config["runs"] = selected_runs(config)  # only_runs: the rest are neither built nor reported
except DistinctcapError as error:
    sys.stderr.write(f"distinctcap: config error: {error}\n")
    sys.exit(1)

DATA = "results/data"
# What a rule's params record (Snakemake reruns a job whose recorded params changed): settings
# without their schema defaults, so a release that adds a defaulted key reruns nothing
# (distinctcap.core.params; docs/pipeline.md, "What reruns").
DEFAULTS = Defaults(CONFIG_SCHEMA)


def unrecorded(value):
    """A param that reaches the script but not Snakemake's params record: a function of the
    rule's input is a derived param, which Snakemake does not record. The rule records the
    canonical form of `value` beside it (a function of the wildcards, or a value)."""
    return lambda wildcards, input: value(wildcards) if callable(value) else value


PREFLIGHT = "results/preflight.txt"  # preflight.smk: checked before the data is fetched
ALL_TARGETS = []  # each stage file appends its final outputs


# --- CLIP: trained or named (features.smk), read by feature extraction and specificity runs --

CLIP = config["clip"]
TRAINED_CLIP = f"results/clip/{CLIP['arch']}.pt"
TRAIN_CLIP = CLIP["pretrained"] == "train"
# the weights file or local-dir folder extraction depends on (none for a tag)
CLIP_FILES = (
    [TRAINED_CLIP]
    if TRAIN_CLIP
    else [p for p in [CLIP["pretrained"].removeprefix("local-dir:")] if Path(p).exists()]
)


# which CLIP the jobs that read one record (none for the default, a CLIP trained here): a file
# or local-dir is an input whose path no other param names
CLIP_RECORD = canonical_params(
    {"clip": CLIP["pretrained"]}, {"clip": DEFAULTS.section("clip").get("pretrained")}
)


# --- The judge CLIP (evaluate.judge; judge.smk): read by the evaluation only ------------------

JUDGE = JudgeSettings.from_config(config)  # None: no judge, its columns are skipped
TRAIN_JUDGE = bool(JUDGE) and JUDGE.trained
TRAINED_JUDGE = f"results/judge/{JUDGE.arch}.pt" if JUDGE else None
JUDGE_FEATURES = "results/judge/features.parquet"  # judge_features: pooled, val and test images
# the judge's weights file or local-dir folder (none for a tag), as CLIP_FILES
JUDGE_FILES = (
    [TRAINED_JUDGE]
    if TRAIN_JUDGE
    else (
        [p for p in [JUDGE.pretrained.removeprefix("local-dir:")] if Path(p).exists()]
        if JUDGE
        else []
    )
)


# --- Runs: training and decoding (train.smk, decode.smk) -------------------------------------

# every trained model: a run once per seed (config.rungraph.seed_runs; one seed: the config's runs)
SEED_RUNS = seed_runs(config)
RUNS = {name: run.block for name, run in SEED_RUNS.items()}
# model name -> [configured run, seed], for the tables that pool a run's seeds
SEED_OF = {name: [run.arm, run.seed] for name, run in SEED_RUNS.items()}
DECODING = config["decoding"]
FEATURES_INDEX = "results/features/index.json"  # extract_features (features.smk)
# captioner.kind transformers: the pre-trained model's frozen vision states are the runs' grid
# (extract_captioner_features) and each run is also exported for transformers (export_hf)
PRETRAINED = config["captioner"].get("kind", "native") == "transformers"
CAPTIONER_FEATURES = "results/features/captioner/index.json" if PRETRAINED else FEATURES_INDEX
# a local pretrained folder is an input of the jobs that read it (editing it reruns them); a
# hub id names no file
PRETRAINED_DIR = [
    p for p in [config["captioner"].get("pretrained")] if PRETRAINED and Path(p).is_dir()
]
ENTROPY_SUBSETS = {"D-": "results/entropy/D-", "D+": "results/entropy/D+"}  # split_entropy
# the neighbours rule's table of the top {pct} percent (neighbours.smk; the same name as
# distinctcap.features.neighbours.table_path, which imports torch)
NEIGHBOURS_TABLE = "results/neighbours/train_top{pct}pct.parquet"
try:  # every run's effective block, checked now so a bad override fails before any job runs
    RUN_CONFIGS = {
        name: effective_run_config({**config, "runs": RUNS}, name, CONFIG_SCHEMA) for name in RUNS
    }
except DistinctcapError as error:
    sys.stderr.write(f"distinctcap: config error: {error}\n")
    sys.exit(1)
# what train_run and run_card record of each run: its effective config without defaults,
# and its method's version where past 1 (methods.facts.method_version)
RUN_RECORDS = {
    name: canonical_params(run, DEFAULTS.effective_run(run)) | method_version(run)
    for name, run in RUN_CONFIGS.items()
}
RUN_PRIORITIES = run_priorities(RUN_CONFIGS)  # train.smk: longest chain of training first
ENTROPY_PRIORITY = entropy_priority(RUN_CONFIGS, RUN_PRIORITIES)  # entropy.smk: heads D-/D+ runs
# features.smk, judge.smk: the CLIPs and their features (the trainer's and the judge's) before
# any training. They ask for 2 threads or more, so once trainings run they wait for both
# cores at once (issue 46: the judge's, at priority 0, left one of 2 cores idle for 27 s while
# the last training ran, and held every evaluate job back)
FEATURES_PRIORITY = max([ENTROPY_PRIORITY, *RUN_PRIORITIES.values()], default=0) + 1


def _choice(names):
    """Wildcard pattern matching exactly one of `names` (never empty)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


wildcard_constraints:
    run=_choice(RUNS),
    decoding=_choice(DECODING),
    split="val|test",


def neighbours_table(pct):
    return NEIGHBOURS_TABLE.format(pct=f"{float(pct):g}")


# What a method's named need (its facts' extra_inputs, distinctcap.methods.facts) becomes in
# the trainer's paths (distinctcap.core.run.RunPaths): need -> function(parameter) -> (input
# files, other entries).
NEED_PATHS = {
    "d_minus": lambda subset: ({"d_minus": ENTROPY_SUBSETS[subset]}, {}),
    "clip": lambda _: (
        {"clip": TRAINED_CLIP} if TRAIN_CLIP else {"clip_files": CLIP_FILES},
        {"clip_arch": CLIP["arch"]}
        | ({} if TRAIN_CLIP else {"clip": CLIP["pretrained"]})
        | ({"clip_tag": CLIP["tag"]} if CLIP.get("tag") else {}),
    ),
    "neighbours": lambda pct: ({"neighbours": neighbours_table(pct)}, {}),
}


def method_paths(run):
    """(input files, other RunPaths entries) that run block `run`'s method needs."""
    files, values = {}, {}
    for need, parameter in FACTS[run["method"]].extra_inputs(run).items():
        need_files, need_values = NEED_PATHS[need](parameter)
        files |= need_files
        values |= need_values
    return files, values


def run_model(name):
    return f"{RUN_DIR}/{name}/model.pt"


def train_inputs(wildcards):
    """Files run {run} reads: data tables, image features, its subset shards (D- / D+), the
    final models of its init / teacher / reference runs, and what its method needs."""
    run = RUNS[wildcards.run]
    inputs = {
        "captions": f"{DATA}/captions.parquet",
        "vocab": f"{DATA}/vocab.json",
        "features": CAPTIONER_FEATURES,
    }
    if PRETRAINED_DIR:
        inputs["pretrained"] = PRETRAINED_DIR[0]
    if run.get("data", "all") != "all":
        inputs["subset"] = ENTROPY_SUBSETS[run["data"]]
    for edge in ("init", "teacher", "reference"):
        if run.get(edge):
            inputs[edge] = run_model(run[edge])
    extra, _ = method_paths(run)
    return inputs | {k: v for k, v in extra.items() if v}


def train_paths(wildcards):
    """Non-file entries of the trainer's RunPaths (e.g. a CLIP tag and architecture)."""
    return method_paths(RUNS[wildcards.run])[1]


def decode_targets():
    """Every run's captions under every decoding setting, for each setting's splits."""
    return [
        GENERATED_PATH.format(run=run, split=split, decoding=name)
        for run in RUNS
        for name, setting in DECODING.items()
        for split in setting["splits"]
    ]


# --- The report's front page (the Snakefile's `report:`) --------------------------------------


def reported_targets(targets):
    """`rule all`'s targets; for `--report` only those that exist, so a report of a run that
    has not finished (or has not started) shows what there is instead of failing."""
    if not report_requested():
        return targets
    return [t for t in targets if Path(t).exists()]


def report_front_page():
    """The front page of `snakemake --report`, written from what exists under results/
    (distinctcap.report.front); the static description for every other command."""
    if not report_requested():
        return "workflow/report/front.rst"
    from distinctcap.report.front import write_front_page

    page = Path(".snakemake/distinctcap/front.rst").resolve()
    return str(write_front_page(config, Path("results"), page))


# --- Checks before the first job (the Snakefile's onstart) -----------------------------------


def rule_gpus(name):
    """The GPUs rule `name` (defined before the call) asks for, as Snakemake resolved its
    resources: the rule's own, the profile's default-resources and set-resources, and
    --set-resources. 0 without one, where the count depends on the attempt, or where there is
    no such rule (no decode without decodings)."""
    if not workflow.is_rule(name):
        return 0
    try:
        return int(workflow.get_rule(name).resources.get("gpu").value or 0)
    except (TypeError, ValueError):  # ValueError: a value of the job's attempt
        return 0


def preflight_holds_a_gpu():
    """With a GPU the config uses, rule preflight checks java on the GPU node, where evaluate
    runs, instead of this (submitting) machine."""
    return rule_gpus("preflight") > 0 and config["device"] != "cpu"


def require_java(jobs):
    """Stop before any job when one of `jobs` evaluates captions and `java` is missing: the
    COCO metrics need it, and otherwise it is found only after every training run finished.
    With a GPU profile rule preflight checks it on the node instead (preflight_holds_a_gpu)."""
    from distinctcap.evaluate.metrics.java import check_java

    if preflight_holds_a_gpu():
        return
    if any(job.rule.name == "evaluate" for job in jobs):
        try:
            check_java()
        except DistinctcapError as error:
            sys.stderr.write(f"distinctcap: {error}\n")
            sys.exit(1)
