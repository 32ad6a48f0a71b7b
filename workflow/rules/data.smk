"""Data stage: the generated shapes world, MS COCO, a Karpathy-format split file or a folder
of images with a captions file, as images/captions tables + tokeniser."""

from distinctcap.config.check import data_stage_params


rule prepare_data:
    input:
        preflight=ancient(PREFLIGHT),  # first in the DAG; a rerun of it reruns nothing here
    output:
        images=f"{DATA}/images.parquet",
        captions=f"{DATA}/captions.parquet",
        quarantine=f"{DATA}/quarantine.parquet",
        vocab=f"{DATA}/vocab.json",
    log:
        "logs/data/prepare_data.log",
    benchmark:
        "benchmarks/prepare_data.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        **stage_version("prepare_data"),
        data=unrecorded(data_stage_params(config["data"])),
        recorded=canonical_params(data_stage_params(config["data"]), DEFAULTS.section("data")),
        on_bad_input=config["on_bad_input"],
    script:
        "../scripts/prepare_data.py"


ALL_TARGETS.extend(rules.prepare_data.output)
