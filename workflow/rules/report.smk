"""Report: the summary table and headline, the papers' table layouts with their published
numbers, each run against the reference, plots and a caption gallery, all wired into
`snakemake --report` (captions in workflow/report/). They read what the evaluation rules
(evaluate.smk) write."""

from distinctcap.core.results import GENERATED_PATH
from distinctcap.report.summary import reference_run

RUNS_RECORD = DEFAULTS.runs(config["runs"])  # the configured runs without their defaults
SEED_RUNS_RECORD = DEFAULTS.runs(RUNS)
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


rule summarize:
    input:
        metrics=METRICS,
    output:
        summary=report(SUMMARY, caption="../report/summary.rst", **TABLES),
        seeds=SUMMARY_SEEDS,
        headline_csv=report(f"{REPORT}/headline.csv", caption="../report/headline.rst", **TABLES),
        headline_md=f"{REPORT}/headline.md",
        headline_tex=f"{REPORT}/headline.tex",
    log:
        "logs/evaluate/summarize.log",
    benchmark:
        "benchmarks/summarize.tsv"
    conda:
        "../../envs/eval.yaml"
    params:
        **stage_version("summarize"),
        runs=unrecorded(config["runs"]),  # the configured runs; their models' seeds pooled (SEED_OF)
        runs_recorded=RUNS_RECORD,
        seed_of=SEED_OF,
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
    log:
        "logs/evaluate/report_tables.log",
    benchmark:
        "benchmarks/report_tables.tsv"
    conda:
        "../../envs/eval.yaml"
    params:
        source=config["data"]["source"],
        reference=reference_run(RUNS),
        seed_of=SEED_OF,
    script:
        "../scripts/report_tables.py"


rule versus_reference:
    """Each run against the MLE reference, paired bootstrap CIs over the images
    (distinctcap.report.versus): CIDEr-D, scene counts, CIDErBtw and DisWordRate from the
    captions (the similar images by the judge CLIP's pooled features, where one is set), R@1,
    mean rank and CLIPScore from the evaluate rule's per-image tables (same order as
    `generated`)."""
    input:
        **JUDGE_SIMILAR,
        generated=[GENERATED_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS],
        per_image=PER_IMAGE,
        images=f"{DATA}/images.parquet",
        captions=f"{DATA}/captions.parquet",
    output:
        csv=report(f"{REPORT}/versus.csv", caption="../report/versus.rst", **TABLES),
        markdown=f"{REPORT}/versus.md",
        latex=f"{REPORT}/versus.tex",
        forest=report(f"{REPORT}/forest.png", caption="../report/forest.rst", **PLOTS),
    log:
        "logs/evaluate/versus_reference.log",
    benchmark:
        "benchmarks/versus_reference.tsv"
    conda:
        "../../envs/eval.yaml"
    params:
        reference=reference_run(RUNS),
        runs=unrecorded(config["runs"]),
        runs_recorded=RUNS_RECORD,
        seed_of=SEED_OF,
        seed=config["seed"],
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
    log:
        "logs/evaluate/report_plots.log",
    benchmark:
        "benchmarks/report_plots.tsv"
    conda:
        "../../envs/eval.yaml"
    params:
        runs=unrecorded(RUNS),
        runs_recorded=SEED_RUNS_RECORD,
        seed_of=SEED_OF,
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
    log:
        "logs/evaluate/report_gallery.log",
    benchmark:
        "benchmarks/report_gallery.tsv"
    conda:
        "../../envs/eval.yaml"
    params:
        split=GALLERY_SPLIT,
        images=EVALUATE["gallery_images"],
        runs=unrecorded(RUNS),
        runs_recorded=SEED_RUNS_RECORD,
        decoding=unrecorded(DECODING),
        decodings_recorded=DEFAULTS.decodings(DECODING),
    script:
        "../scripts/report_gallery.py"


if EVALUATIONS:
    ALL_TARGETS.extend(
        [
            *rules.summarize.output,
            *rules.report_tables.output,
            *(rules.versus_reference.output if reference_run(RUNS) else []),
            *rules.report_plots.output,
            *(rules.report_gallery.output if GALLERY else []),
        ]
    )
