"""Decoding stage: each run's captions of a split under each named `decoding:` setting, as the
`generated` table (ARCHITECTURE.md, "Data contracts"). One job per run decodes all its
(split, decoding) pairs: one Python and torch start per run, not per decoding (issue 19)."""

from distinctcap.core.results import GENERATED_PATH

DECODES = list(dict.fromkeys((s, d) for d, setting in DECODING.items() for s in setting["splits"]))


if DECODES:  # a rule needs outputs; `decoding: {}` decodes nothing

    rule decode:
        input:
            model=f"{RUN_DIR}/{{run}}/model.pt",
            features=CAPTIONER_FEATURES,
            images=f"{DATA}/images.parquet",
            vocab=f"{DATA}/vocab.json",
        output:
            generated=[GENERATED_PATH.format(run="{run}", split=s, decoding=d) for s, d in DECODES],
        log:
            "logs/decode/{run}.log",
        benchmark:
            "benchmarks/decode/{run}.tsv"
        conda:
            "../../envs/torch.yaml"
        threads: 1
        params:
            **stage_version("decode"),
            decodes=unrecorded([(s, d, DECODING[d]) for s, d in DECODES]),
            recorded=[(s, d, DEFAULTS.decodings(DECODING)[d]) for s, d in DECODES],
            seed=config["seed"],
            device=config["device"],
        script:
            "../scripts/decode.py"


ALL_TARGETS.extend(decode_targets())
