"""The judge CLIP (evaluate.judge; docs/report.md, "The judge CLIP"): a CLIP that only the
evaluation reads, never a training rule, a checkpoint selection or an objective. Trained like
the trainer's CLIP by the same script (evaluate.judge.pretrained = train; the weights shipped in
assets/clip/ of the same training fingerprint are taken instead), then the pooled embeddings of
the val and test images (distinctcap.features.pooled) for the evaluate rules."""

# JUDGE (a distinctcap.core.settings.JudgeSettings), TRAIN_JUDGE, TRAINED_JUDGE, JUDGE_FILES and
# JUDGE_FEATURES are defined in common.smk: the evaluate rules read them too.

if TRAIN_JUDGE:

    rule train_judge_clip:
        input:
            images=f"{DATA}/images.parquet",
            captions=f"{DATA}/captions.parquet",
        output:
            weights=TRAINED_JUDGE,
            retrieval=report(
                "results/judge/retrieval.json", caption="../report/judge.rst", category="CLIP"
            ),
        log:
            "logs/judge/train_judge_clip.log",
        benchmark:
            "benchmarks/train_judge_clip.tsv"
        priority: FEATURES_PRIORITY  # before the trainings (common.smk)
        conda:
            "../../envs/torch.yaml"
        threads: 2  # as train_clip
        params:
            **stage_version("train_clip"),
            arch=JUDGE.arch,
            train=unrecorded(JUDGE.train),
            recorded=canonical_params(JUDGE.train, DEFAULTS.section("clip", "train")),
            seed=JUDGE.seed,
            device=config["device"],
            checkpoint=lambda w, output: str(
                Path(output.weights).parent / "checkpoints" / Path(output.weights).name
            ),
        script:
            "../scripts/train_clip.py"


if JUDGE:

    rule judge_features:
        input:
            images=f"{DATA}/images.parquet",
            weights=JUDGE_FILES,
        output:
            features=JUDGE_FEATURES,
        log:
            "logs/judge/judge_features.log",
        benchmark:
            "benchmarks/judge_features.tsv"
        priority: FEATURES_PRIORITY  # before the trainings (common.smk)
        conda:
            "../../envs/torch.yaml"
        threads: features_threads(config["device"], local_cores(workflow))  # as extract_features
        params:
            **stage_version("extract_features"),
            arch=JUDGE.arch,
            pretrained=lambda w, input: input.weights[0] if TRAIN_JUDGE else JUDGE.pretrained,
            tag=JUDGE.tag,
            settings=unrecorded(CLIP["features"]),
            recorded=canonical_params(CLIP["features"], DEFAULTS.section("clip", "features"))
            | canonical_params({"judge": JUDGE.pretrained}, {"judge": "train"}),
            device=config["device"],
        script:
            "../scripts/judge_features.py"

    ALL_TARGETS.extend(
        [*rules.judge_features.output, *(rules.train_judge_clip.output if TRAIN_JUDGE else [])]
    )
