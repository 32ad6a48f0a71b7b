"""Where the outputs named by a run and a decoding live under results/ (ARCHITECTURE.md, Data
contracts): the one owner of these paths for the rules that write them (workflow/rules/
train.smk, decode.smk, evaluate.smk), the readers that find them (runs.budget) and the config
check that no two names write one path (distinctcap.config.check.check_outputs).

Templates take `run`, `split` and `decoding`; a rule passes run="{run}" to keep Snakemake's
wildcard. Imports nothing: the workflow reads it while Snakemake parses.
"""

RUN_DIR = "results/runs"  # a model's folder, RUN_DIR/<run>/: model.pt, curve.csv, run.json, ...
GENERATED_DIR = "results/generated"
METRICS_DIR = "results/metrics"

GENERATED_PATH = GENERATED_DIR + "/{run}/{split}-{decoding}.parquet"
METRICS_PATH = METRICS_DIR + "/{run}/{split}-{decoding}.parquet"
CIDER_CURVE_PATH = METRICS_DIR + "/{run}/{split}-{decoding}-cider_vs_n.csv"
PER_IMAGE_PATH = METRICS_DIR + "/{run}/{split}-{decoding}-per_image.parquet"
DEVICE_PART_PATH = METRICS_DIR + "/{run}/{split}-{decoding}-gpu.parquet"  # evaluate_gpu's, temp
WORK_PATH = METRICS_DIR + "/{run}/work.json"  # the evaluate job's work record

# the outputs a run's name is part of, and those a decoding's name is part of
RUN_OUTPUTS = (RUN_DIR + "/{run}", GENERATED_DIR + "/{run}", METRICS_DIR + "/{run}")
DECODING_OUTPUTS = (GENERATED_PATH, METRICS_PATH, CIDER_CURVE_PATH, PER_IMAGE_PATH)
