"""Data stage: the generated shapes world or MS COCO, as images/captions tables + tokeniser."""


rule prepare_data:
    input:
        preflight=ancient(PREFLIGHT),  # first in the DAG; a rerun of it reruns nothing here
    output:
        images=f"{DATA}/images.parquet",
        captions=f"{DATA}/captions.parquet",
        quarantine=f"{DATA}/quarantine.parquet",
        vocab=f"{DATA}/vocab.json",
    params:
        data=config["data"],
        on_bad_input=config["on_bad_input"],
    log:
        "logs/data/prepare_data.log",
    benchmark:
        "benchmarks/prepare_data.tsv"
    conda:
        "../../envs/data.yaml"
    script:
        "../scripts/prepare_data.py"


ALL_TARGETS.extend(rules.prepare_data.output)
