"""Evaluation and report: one metrics rule per run, split and decoding setting, the summary
table, the papers' table layouts with their published numbers, plots and a caption gallery,
all wired into `snakemake --report` (captions in workflow/report/)."""

import os

from distinctcap.core.cores import evaluate_threads, pending_runs
from distinctcap.core.results import (
    CIDER_CURVE_PATH,
    DEVICE_PART_PATH,
    GENERATED_PATH,
    METRICS_PATH,
    PER_IMAGE_PATH,
    WORK_PATH,
)
from distinctcap.core.settings import metric_block
from distinctcap.report.summary import evaluation_keys, reference_run

EVALUATE = config["evaluate"]
# a judge's keys recorded without their defaults, as the clip section's
METRIC_DEFAULTS = DEFAULTS.section("evaluate") | ({"judge": DEFAULTS.judge()} if JUDGE else {})
METRIC_RECORD = canonical_params(metric_block(EVALUATE), METRIC_DEFAULTS) | CLIP_RECORD
RUNS_RECORD = DEFAULTS.runs(config["runs"])  # the configured runs without their defaults
SEED_RUNS_RECORD = DEFAULTS.runs(RUNS)
EVALUATIONS = evaluation_keys(RUNS, DECODING)
# One evaluate job per run covers all its (split, decoding) pairs: one Python, CLIP and METEOR
# start per run instead of per decoding (issue 19: METEOR's start is ~9 CPU s).
PER_RUN = list(dict.fromkeys((s, d) for _, s, d in EVALUATIONS))
# the paths are distinctcap.core.results's templates
METRICS = [METRICS_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS]
CIDER_CURVES = [CIDER_CURVE_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS]
# CLIP rank and CLIPScore of each image's first caption, for versus_reference's intervals
PER_IMAGE = [PER_IMAGE_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS]
GALLERY_SPLIT = EVALUATE["gallery_split"]
GALLERY = [
    GENERATED_PATH.format(run=r, split=s, decoding=d)
    for r, s, d in EVALUATIONS
    if s == GALLERY_SPLIT
]
REPORT = "results/report"
SUMMARY = "results/metrics/summary.csv"
SUMMARY_SEEDS = "results/metrics/summary_seeds.csv"  # each run's mean and sd over its seeds
TABLES = {"category": "Evaluation", "subcategory": "Tables"}
PLOTS = {"category": "Evaluation", "subcategory": "Plots"}
SHOWCASE = {"category": "Evaluation", "subcategory": "Caption gallery"}
TRAINING = {"category": "Training"}
# The runs this invocation still trains or evaluates (those without an evaluate record): the
# evaluate job's threads share the local cores among them (core.cores.evaluate_threads)
PENDING_RUNS = pending_runs(RUNS, lambda run: os.path.exists(WORK_PATH.format(run=run)))


# The torch part of a run's evaluation (CLIP retrieval and CLIPScore, the captioner's
# self-retrieval, GPT-2 perplexity) is minutes of GPU work. Where the profile gives it a GPU
# (local-gpu, slurm) it is its own job, evaluate_gpu, so that the evaluate job's CPU metrics
# (minutes to hours of them at COCO size) hold no GPU. Without one (a plain `snakemake`), the
# evaluate job computes it itself: one process start and CLIP load per run instead of two.
EVALUATE_GPU_JOB = profile_gives_a_gpu("evaluate_gpu")
# one evaluate job's (split, decoding) pairs, of the {run} wildcard
GENERATED = [GENERATED_PATH.format(run="{run}", split=s, decoding=d) for s, d in PER_RUN]
PER_IMAGE_OUT = [PER_IMAGE_PATH.format(run="{run}", split=s, decoding=d) for s, d in PER_RUN]
DEVICE_PART = [DEVICE_PART_PATH.format(run="{run}", split=s, decoding=d) for s, d in PER_RUN]
TEXT_INPUTS = dict(
    generated=GENERATED,
    images=f"{DATA}/images.parquet",
    captions=f"{DATA}/captions.parquet",
    vocab=f"{DATA}/vocab.json",
    features=FEATURES_INDEX,
)
TORCH_INPUTS = dict(
    clip=CLIP_FILES,
    model=f"{RUN_DIR}/{{run}}/model.pt",
    captioner_features=CAPTIONER_FEATURES,
    # the judge CLIP's features and weights (evaluate.judge): only when one is configured
    **(dict(judge_features=JUDGE_FEATURES, judge_clip=JUDGE_FILES) if JUDGE else {}),
)

if PER_RUN and EVALUATE_GPU_JOB:  # a rule needs outputs; `decoding: {}` evaluates nothing

    rule evaluate_gpu:
        input:
            **TEXT_INPUTS,
            **TORCH_INPUTS,
        output:
            device=[temp(path) for path in DEVICE_PART],
            per_image=PER_IMAGE_OUT,
        params:
            evaluations=PER_RUN,
            settings=unrecorded(metric_block(EVALUATE)),
            recorded=METRIC_RECORD,
            **stage_version("evaluate"),
            seed=config["seed"],
            device=config["device"],
        # one torch thread on the CPU: CPU numbers must not depend on the core count
        threads: 1
        log:
            "logs/evaluate/{run}-gpu.log",
        benchmark:
            "benchmarks/evaluate_gpu/{run}.tsv"
        conda:
            "../../envs/eval.yaml"
        script:
            "../scripts/evaluate_gpu.py"

if PER_RUN:

    rule evaluate:
        input:
            **TEXT_INPUTS,
            # the evaluate_gpu job's values, or what computing the torch part here reads
            **(dict(device=DEVICE_PART, per_image=PER_IMAGE_OUT) if EVALUATE_GPU_JOB else TORCH_INPUTS),
        output:
            metrics=[METRICS_PATH.format(run="{run}", split=s, decoding=d) for s, d in PER_RUN],
            curve=[CIDER_CURVE_PATH.format(run="{run}", split=s, decoding=d) for s, d in PER_RUN],
            # the captions each metric scored, per (split, decoding): the work budget's record
            work=WORK_PATH,
            **({} if EVALUATE_GPU_JOB else dict(per_image=PER_IMAGE_OUT)),
        params:
            evaluations=PER_RUN,
            settings=unrecorded(metric_block(EVALUATE)),
            recorded=METRIC_RECORD,
            **stage_version("evaluate"),
            seed=config["seed"],
            # the torch part's device when it is computed here; torch gets one thread
            device="cpu" if EVALUATE_GPU_JOB else config["device"],
            # reference token sets by content hash, reused by later jobs and runs (and
            # SPICE's parse cache): inside the results folder, never outside it
            cache="results/cache/evaluate",
        # the text metrics' forked workers, METEOR servers and tokenizer JVMs: the local cores
        # shared among the pending runs (1 each on a 2-core box with several pending, both
        # when one run is), 8 on a cluster (core.cores.evaluate_threads); the
        # numbers do not depend on it
        threads: evaluate_threads(local_cores(workflow), PENDING_RUNS)
        log:
            "logs/evaluate/{run}.log",
        benchmark:
            "benchmarks/evaluate/{run}.tsv"
        conda:
            "../../envs/eval.yaml"
        script:
            "../scripts/evaluate.py"


rule summarize:
    input:
        metrics=METRICS,
    output:
        summary=report(SUMMARY, caption="../report/summary.rst", **TABLES),
        seeds=SUMMARY_SEEDS,
        headline_csv=report(f"{REPORT}/headline.csv", caption="../report/headline.rst", **TABLES),
        headline_md=f"{REPORT}/headline.md",
        headline_tex=f"{REPORT}/headline.tex",
    params:
        runs=unrecorded(config["runs"]),  # the configured runs; their models' seeds pooled (SEED_OF)
        runs_recorded=RUNS_RECORD,
        seed_of=SEED_OF,
    log:
        "logs/evaluate/summarize.log",
    benchmark:
        "benchmarks/summarize.tsv"
    conda:
        "../../envs/eval.yaml"
    script:
        "../scripts/summarize.py"


rule report_tables:
    input:
        metrics=METRICS,
    output:
        markdown=f"{REPORT}/tables.md",
        html=report(f"{REPORT}/tables.html", caption="../report/tables.rst", **TABLES),
        latex=f"{REPORT}/tables.tex",
        csv=f"{REPORT}/tables.csv",
    params:
        source=config["data"]["source"],
        reference=reference_run(RUNS),
        seed_of=SEED_OF,
    log:
        "logs/evaluate/report_tables.log",
    benchmark:
        "benchmarks/report_tables.tsv"
    conda:
        "../../envs/eval.yaml"
    script:
        "../scripts/report_tables.py"


rule versus_reference:
    """Each run against the MLE reference, paired bootstrap CIs over the images
    (distinctcap.report.versus): CIDEr-D and scene counts from the captions, R@1, mean rank
    and CLIPScore from the evaluate rule's per-image tables (same order as `generated`)."""
    input:
        generated=[GENERATED_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS],
        per_image=PER_IMAGE,
        images=f"{DATA}/images.parquet",
        captions=f"{DATA}/captions.parquet",
    output:
        csv=report(f"{REPORT}/versus.csv", caption="../report/versus.rst", **TABLES),
        markdown=f"{REPORT}/versus.md",
        latex=f"{REPORT}/versus.tex",
        forest=report(f"{REPORT}/forest.png", caption="../report/forest.rst", **PLOTS),
    params:
        reference=reference_run(RUNS),
        runs=unrecorded(config["runs"]),
        runs_recorded=RUNS_RECORD,
        seed_of=SEED_OF,
        seed=config["seed"],
    log:
        "logs/evaluate/versus_reference.log",
    benchmark:
        "benchmarks/versus_reference.tsv"
    conda:
        "../../envs/eval.yaml"
    script:
        "../scripts/versus_reference.py"


rule report_plots:
    input:
        metrics=METRICS,
        training=[f"{RUN_DIR}/{run}/curve.csv" for run in RUNS],
        cider=CIDER_CURVES,
        # the metric bars' error bars: each run's interval against the reference
        versus=[f"{REPORT}/versus.csv"] if reference_run(RUNS) else [],
    output:
        training=report(f"{REPORT}/training.png", caption="../report/training.rst", **TRAINING),
        bars=report(f"{REPORT}/metric_bars.png", caption="../report/metric_bars.rst", **PLOTS),
        cider=report(f"{REPORT}/cider_vs_n.png", caption="../report/cider_vs_n.rst", **PLOTS),
    params:
        runs=unrecorded(RUNS),
        runs_recorded=SEED_RUNS_RECORD,
        seed_of=SEED_OF,
    log:
        "logs/evaluate/report_plots.log",
    benchmark:
        "benchmarks/report_plots.tsv"
    conda:
        "../../envs/eval.yaml"
    script:
        "../scripts/report_plots.py"


rule report_gallery:
    input:
        generated=GALLERY,
        images=f"{DATA}/images.parquet",
        captions=f"{DATA}/captions.parquet",
    output:
        html=report(f"{REPORT}/gallery.html", caption="../report/gallery.rst", **SHOWCASE),
        showcase=f"{REPORT}/showcase.md",
    params:
        split=GALLERY_SPLIT,
        images=EVALUATE["gallery_images"],
        runs=unrecorded(RUNS),
        runs_recorded=SEED_RUNS_RECORD,
        decoding=unrecorded(DECODING),
        decodings_recorded=DEFAULTS.decodings(DECODING),
    log:
        "logs/evaluate/report_gallery.log",
    benchmark:
        "benchmarks/report_gallery.tsv"
    conda:
        "../../envs/eval.yaml"
    script:
        "../scripts/report_gallery.py"


if EVALUATIONS:
    ALL_TARGETS.extend(
        [
            *METRICS,  # targets themselves, so a deleted one is regenerated by a plain snakemake
            *CIDER_CURVES,
            *PER_IMAGE,
            *rules.summarize.output,
            *rules.report_tables.output,
            *(rules.versus_reference.output if reference_run(RUNS) else []),
            *rules.report_plots.output,
            *(rules.report_gallery.output if GALLERY else []),
        ]
    )
