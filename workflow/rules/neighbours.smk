"""Neighbours stage: the contrastive images of the specificity method (specificity paper §3.2),
each training image's top {pct} percent most similar training images by CLIP image embedding.
One cached table per percentage; a specificity run asks for
neighbours_table(runs.<name>.contrastive_top_pct) (common.smk)."""


rule neighbours:
    input:
        features=rules.extract_features.output.index,
        images=f"{DATA}/images.parquet",
    output:
        table=NEIGHBOURS_TABLE,
    log:
        "logs/neighbours/train_top{pct}pct.log",
    benchmark:
        "benchmarks/neighbours/train_top{pct}pct.tsv"
    wildcard_constraints:
        pct=r"[0-9]+(\.[0-9]+)?",
    conda:
        "../../envs/torch.yaml"
    params:
        device=config["device"],
    script:
        "../scripts/neighbours.py"
