"""Preflight: the node's driver, GPU, java, disk, /dev/shm and weights, checked before the data
is downloaded (distinctcap.core.preflight). The GPU profiles run it on the GPU rules' partition
with one GPU; without a GPU it skips the GPU checks and takes a fraction of a second. Its
output is an `ancient` input of prepare_data: it runs first, and rerunning it (a new node:
`snakemake --forcerun preflight`, or an edited config) never reruns anything after it."""


rule preflight:
    output:
        report=PREFLIGHT,
    params:
        config=config,
    log:
        "logs/preflight.log",
    benchmark:
        "benchmarks/preflight.tsv"
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/preflight.py"
