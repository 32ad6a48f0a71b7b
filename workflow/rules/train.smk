"""Training stage: one generic rule trains any entry of `runs:` (ARCHITECTURE.md, "Runs are data").
The run's effective config is a param, so editing its block reruns that run and its dependents.
Resume checkpoints live in results/runs/{run}/checkpoints/, not a declared output, so a killed
or failed job keeps them and the rerun continues from the last one if the run's config and
input files are unchanged (else the trainer sets it aside, distinctcap.train.trainer)."""


rule train_run:
    input:
        unpack(train_inputs),
    output:
        model=f"{RUN_DIR}/{{run}}/model.pt",
        curve=f"{RUN_DIR}/{{run}}/curve.csv",
        summary=f"{RUN_DIR}/{{run}}/summary.json",
    log:
        "logs/train/{run}.log",
    benchmark:
        "benchmarks/train_run/{run}.tsv"
    priority: lambda w: RUN_PRIORITIES[w.run]
    conda:
        "../../envs/torch.yaml"
    threads: 1  # the shapes-size captioner is fastest on one thread; profiles may set more
    params:
        **stage_version("train_run"),
        run=unrecorded(lambda w: RUN_CONFIGS[w.run]),  # the trainer's; RUN_RECORDS recorded
        recorded=lambda w: RUN_RECORDS[w.run],
        paths=train_paths,
        device=config["device"],
    script:
        "../scripts/train.py"


rule run_card:
    """The run folder's card and vocabulary copy, so `distinctcap caption` needs only the
    folder and its CLIP (distinctcap.core.runcard), with the threshold that flags images far
    from the training images (distinctcap.runs.calibrate)."""
    input:
        model=f"{RUN_DIR}/{{run}}/model.pt",
        vocab=f"{DATA}/vocab.json",
        images=f"{DATA}/images.parquet",
        features=FEATURES_INDEX,
        clip=CLIP_FILES,
    output:
        card=f"{RUN_DIR}/{{run}}/run.json",
        vocab=f"{RUN_DIR}/{{run}}/vocab.json",
    log:
        "logs/train/{run}-card.log",
    benchmark:
        "benchmarks/run_card/{run}.tsv"
    conda:
        "../../envs/torch.yaml"
    params:
        **stage_version("run_card"),
        run=unrecorded(lambda w: RUN_CONFIGS[w.run]),
        recorded=lambda w: RUN_RECORDS[w.run],
        decoding=unrecorded(DECODING),
        decodings_recorded=DEFAULTS.decodings(DECODING),
        clip_recorded=CLIP_RECORD,
        clip=lambda w, input: input.clip[0] if TRAIN_CLIP else CLIP["pretrained"],
    script:
        "../scripts/run_card.py"


ALL_TARGETS.extend(run_model(run) for run in RUNS)


rule export_hf:
    """A transformers run as a save_pretrained folder (from_pretrained, pipeline)."""
    input:
        model=f"{RUN_DIR}/{{run}}/model.pt",
    output:
        directory(f"{RUN_DIR}/{{run}}/hf"),
    log:
        "logs/train/{run}-export_hf.log",
    benchmark:
        "benchmarks/export_hf/{run}.tsv"
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/export_hf.py"


ALL_TARGETS.extend(f"{RUN_DIR}/{run}/hf" for run in RUNS if PRETRAINED)
ALL_TARGETS.extend(f"{RUN_DIR}/{run}/run.json" for run in RUNS)
