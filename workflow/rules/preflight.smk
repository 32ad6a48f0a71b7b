"""Preflight: the node's driver, GPU, java, disk, /dev/shm and weights, checked before the data
is downloaded (distinctcap.runs.preflight). The GPU profiles run it on the GPU rules' partition
with one GPU; without a GPU it skips the GPU checks and takes a fraction of a second. Its
output is an `ancient` input of prepare_data: it runs first, and rerunning it (a new node:
`snakemake --forcerun preflight`) never reruns anything after it. It takes no params: Snakemake
(9.27) plans no job whose params changed downstream of an `ancient` input whose producer reruns,
so a preflight rerun on every config edit would hide that edit for one invocation (the script
reads the config itself)."""


rule preflight:
    output:
        report=PREFLIGHT,
    log:
        "logs/preflight.log",
    benchmark:
        "benchmarks/preflight.tsv"
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/preflight.py"
