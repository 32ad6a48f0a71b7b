"""Retrieval entropy filtering (UNKT §3.1, eq. 3): score every train caption, split the ranking
into D- (top entropy.fraction) and D+, and report. Only split_entropy and what follows depend
on entropy.fraction, so editing it reruns just those."""

ENTROPY = config["entropy"]


rule retrieval_entropy:
    input:
        index=rules.extract_features.output.index,
        captions=f"{DATA}/captions.parquet",
    output:
        scores="results/entropy/scores.parquet",
    log:
        "logs/entropy/retrieval_entropy.log",
    benchmark:
        "benchmarks/retrieval_entropy.tsv"
    priority: ENTROPY_PRIORITY
    conda:
        "../../envs/torch.yaml"
    threads: 2  # profiles may set more
    params:
        logit_scale=ENTROPY["logit_scale"],
        chunk=ENTROPY["chunk"],
        text_chunk=ENTROPY["text_chunk"],
        device=config["device"],
    script:
        "../scripts/retrieval_entropy.py"


rule split_entropy:
    input:
        scores=rules.retrieval_entropy.output.scores,
        captions=f"{DATA}/captions.parquet",
    output:
        table="results/entropy/entropy.parquet",
        negative=directory("results/entropy/D-"),
        positive=directory("results/entropy/D+"),
    log:
        "logs/entropy/split_entropy.log",
    benchmark:
        "benchmarks/split_entropy.tsv"
    priority: ENTROPY_PRIORITY
    conda:
        "../../envs/torch.yaml"
    params:
        fraction=ENTROPY["fraction"],
        shard_size=ENTROPY["shard_size"],
    script:
        "../scripts/split_entropy.py"


rule entropy_report:
    input:
        table=rules.split_entropy.output.table,
        captions=f"{DATA}/captions.parquet",
    output:
        histogram=report("results/report/entropy_histogram.png", category="Retrieval entropy"),
        extremes=report(
            "results/report/entropy_extremes.md",
            caption="../report/entropy_extremes.rst",
            category="Retrieval entropy",
        ),
    log:
        "logs/entropy/entropy_report.log",
    benchmark:
        "benchmarks/entropy_report.tsv"
    conda:
        "../../envs/torch.yaml"
    params:
        top=ENTROPY["report_top"],
    script:
        "../scripts/entropy_report.py"


ALL_TARGETS.extend([*rules.split_entropy.output, *rules.entropy_report.output])
