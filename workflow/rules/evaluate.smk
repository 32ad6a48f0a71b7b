"""Evaluation: one job per run scores its captions under every (split, decoding) pair: the
metrics tables, the CIDEr-vs-n curves and the per-image tables that the report rules
(report.smk) read."""

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
from distinctcap.report.summary import evaluation_keys

EVALUATE = config["evaluate"]
# a judge's keys recorded without their defaults, as the clip section's
METRIC_DEFAULTS = DEFAULTS.section("evaluate") | ({"judge": DEFAULTS.judge()} if JUDGE else {})
METRIC_RECORD = canonical_params(metric_block(EVALUATE), METRIC_DEFAULTS) | CLIP_RECORD
EVALUATIONS = evaluation_keys(RUNS, DECODING)
# One evaluate job per run covers all its (split, decoding) pairs: one Python, CLIP and METEOR
# start per run instead of per decoding (issue 19: METEOR's start is ~9 CPU s).
PER_RUN = list(dict.fromkeys((s, d) for _, s, d in EVALUATIONS))
# the paths are distinctcap.core.results's templates
METRICS = [METRICS_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS]
CIDER_CURVES = [CIDER_CURVE_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS]
# CLIP rank and CLIPScore of each image's first caption, for versus_reference's intervals
PER_IMAGE = [PER_IMAGE_PATH.format(run=r, split=s, decoding=d) for r, s, d in EVALUATIONS]
# The runs this invocation still trains or evaluates (those without an evaluate record): the
# evaluate job's threads share the local cores among them (core.cores.evaluate_threads)
PENDING_RUNS = pending_runs(RUNS, lambda run: os.path.exists(WORK_PATH.format(run=run)))


# The torch part of a run's evaluation (CLIP retrieval and CLIPScore, the captioner's
# self-retrieval, GPT-2 perplexity) is minutes of GPU work. Where the profile gives the runs'
# decoding a GPU (local-gpu, slurm; rule decode, which is defined before this rule, and on
# SLURM shares one job and its GPU with evaluate_gpu) it is its own job, evaluate_gpu, so
# that the evaluate job's CPU metrics (minutes to hours of them at COCO size) hold no GPU.
# Without one (a plain `snakemake`), the evaluate job computes it itself: one process start
# and CLIP load per run instead of two.
EVALUATE_GPU_JOB = rule_gpus("decode") > 0
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
# the judge's pooled features alone: the similar images of evaluate.distinctive's columns
JUDGE_SIMILAR = dict(judge_features=JUDGE_FEATURES) if JUDGE else {}

if PER_RUN and EVALUATE_GPU_JOB:  # a rule needs outputs; `decoding: {}` evaluates nothing

    rule evaluate_gpu:
        input:
            **TEXT_INPUTS,
            **TORCH_INPUTS,
        output:
            device=[temp(path) for path in DEVICE_PART],
            per_image=PER_IMAGE_OUT,
        log:
            "logs/evaluate/{run}-gpu.log",
        benchmark:
            "benchmarks/evaluate_gpu/{run}.tsv"
        conda:
            "../../envs/eval.yaml"
        # one torch thread on the CPU: CPU numbers must not depend on the core count
        threads: 1
        params:
            **stage_version("evaluate"),
            evaluations=PER_RUN,
            settings=unrecorded(metric_block(EVALUATE)),
            recorded=METRIC_RECORD,
            seed=config["seed"],
            device=config["device"],
        script:
            "../scripts/evaluate_gpu.py"


if PER_RUN:

    rule evaluate:
        input:
            **TEXT_INPUTS,
            # the evaluate_gpu job's values (and the judge's features, for the similar
            # images of CIDErBtw and DisWordRate), or what computing the torch part here reads
            **(
                dict(device=DEVICE_PART, per_image=PER_IMAGE_OUT, **JUDGE_SIMILAR)
                if EVALUATE_GPU_JOB
                else TORCH_INPUTS
            ),
        output:
            **({} if EVALUATE_GPU_JOB else dict(per_image=PER_IMAGE_OUT)),
            metrics=[METRICS_PATH.format(run="{run}", split=s, decoding=d) for s, d in PER_RUN],
            curve=[CIDER_CURVE_PATH.format(run="{run}", split=s, decoding=d) for s, d in PER_RUN],
            # the captions each metric scored, per (split, decoding): the work budget's record
            work=WORK_PATH,
        log:
            "logs/evaluate/{run}.log",
        benchmark:
            "benchmarks/evaluate/{run}.tsv"
        conda:
            "../../envs/eval.yaml"
        # the text metrics' forked workers, METEOR servers and tokenizer JVMs: the local cores
        # shared among the pending runs (1 each on a 2-core box with several pending, both
        # when one run is), 8 on a cluster (core.cores.evaluate_threads); the
        # numbers do not depend on it
        threads: evaluate_threads(local_cores(workflow), PENDING_RUNS)
        params:
            **stage_version("evaluate"),
            evaluations=PER_RUN,
            settings=unrecorded(metric_block(EVALUATE)),
            recorded=METRIC_RECORD,
            seed=config["seed"],
            # the torch part's device when it is computed here; torch gets one thread
            device="cpu" if EVALUATE_GPU_JOB else config["device"],
            # reference token sets by content hash, reused by later jobs and runs (and
            # SPICE's parse cache): inside the results folder, never outside it
            cache="results/cache/evaluate",
        script:
            "../scripts/evaluate.py"


if EVALUATIONS:
    # targets themselves, so a deleted one is regenerated by a plain snakemake
    ALL_TARGETS.extend([*METRICS, *CIDER_CURVES, *PER_IMAGE])
