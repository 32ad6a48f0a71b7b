"""Decoding stage: each run's captions of a split under each named `decoding:` setting, as the
`generated` table (ARCHITECTURE.md, "Data contracts")."""


rule decode:
    input:
        model=f"{RUN_DIR}/{{run}}/model.pt",
        features=CAPTIONER_FEATURES,
        images=f"{DATA}/images.parquet",
        vocab=f"{DATA}/vocab.json",
    output:
        generated="results/generated/{run}/{split}-{decoding}.parquet",
    params:
        setting=lambda w: DECODING[w.decoding],
        seed=config["seed"],
        device=config["device"],
    threads: 1
    log:
        "logs/decode/{run}/{split}-{decoding}.log",
    benchmark:
        "benchmarks/decode/{run}/{split}-{decoding}.tsv"
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/decode.py"


ALL_TARGETS.extend(decode_targets())
