"""CLIP stage: train the tiny CLIP (shapes world, clip.pretrained = train), resumable from its
epoch checkpoint under results/clip/checkpoints/, then extract pooled + grid image features and
text features into resumable shards under results/features/cache/ (neither is a declared
output, so a killed run keeps them)."""

# CLIP, TRAINED_CLIP, TRAIN_CLIP and CLIP_FILES are defined in common.smk: a specificity
# run reads the CLIP too (its train_run inputs).


rule train_clip:
    input:
        images=f"{DATA}/images.parquet",
        captions=f"{DATA}/captions.parquet",
    output:
        weights=TRAINED_CLIP,
        retrieval=report(
            "results/clip/retrieval.json", caption="../report/retrieval.rst", category="CLIP"
        ),
    log:
        "logs/features/train_clip.log",
    benchmark:
        "benchmarks/train_clip.tsv"
    priority: FEATURES_PRIORITY  # before the trainings (common.smk)
    conda:
        "../../envs/torch.yaml"
    threads: 2  # the conv tower steps 1.55x faster on two threads than on one (2-core box)
    params:
        **stage_version("train_clip"),
        arch=CLIP["arch"],
        train=unrecorded(CLIP["train"]),
        recorded=canonical_params(CLIP["train"], DEFAULTS.section("clip", "train")),
        seed=config["seed"],
        device=config["device"],
        # not an output, so a killed job keeps it and the rerun resumes from its last epoch
        checkpoint=lambda w, output: str(
            Path(output.weights).parent / "checkpoints" / Path(output.weights).name
        ),
    script:
        "../scripts/train_clip.py"


rule extract_features:
    input:
        images=f"{DATA}/images.parquet",
        captions=f"{DATA}/captions.parquet",
        weights=CLIP_FILES,
    output:
        index="results/features/index.json",
    log:
        "logs/features/extract_features.log",
    benchmark:
        "benchmarks/extract_features.tsv"
    priority: FEATURES_PRIORITY  # before the trainings (common.smk)
    conda:
        "../../envs/torch.yaml"
    # Every CPU of its job: snakemake caps a rule's threads at --cores, and a SLURM job runs
    # on the CPUs of its profile's cpus_per_task. On a GPU they decode images (DataLoader
    # workers, clip.features.workers auto); on the CPU the script computes on one thread, so a
    # job surely on this machine's CPU asks for one (core.cores.features_threads)
    threads: features_threads(config["device"], local_cores(workflow))
    params:
        **stage_version("extract_features"),
        arch=CLIP["arch"],
        pretrained=lambda w, input: input.weights[0] if TRAIN_CLIP else CLIP["pretrained"],
        tag=CLIP.get("tag"),
        settings=unrecorded(CLIP["features"]),
        recorded=canonical_params(CLIP["features"], DEFAULTS.section("clip", "features"))
        | CLIP_RECORD,
        device=config["device"],
        cache=lambda w, output: str(Path(output.index).parent / "cache"),
    script:
        "../scripts/extract_features.py"


rule extract_captioner_features:
    input:
        images=f"{DATA}/images.parquet",
        pretrained=PRETRAINED_DIR,
    output:
        index="results/features/captioner/index.json",
    log:
        "logs/features/extract_captioner_features.log",
    benchmark:
        "benchmarks/extract_captioner_features.tsv"
    conda:
        "../../envs/torch.yaml"
    threads: 256  # as extract_features: DataLoader workers on a GPU, one thread on the CPU
    params:
        pretrained=config["captioner"].get("pretrained"),
        vision=config["captioner"].get("vision", "frozen"),
        settings=unrecorded(CLIP["features"]),
        recorded=canonical_params(CLIP["features"], DEFAULTS.section("clip", "features")),
        device=config["device"],
        cache=lambda w, output: str(Path(output.index).parent / "cache"),
    script:
        "../scripts/extract_captioner_features.py"


ALL_TARGETS.extend([CAPTIONER_FEATURES] if PRETRAINED else [])
ALL_TARGETS.extend(
    [
        *rules.extract_features.output,
        *(rules.train_clip.output if TRAIN_CLIP else []),
    ]
)
