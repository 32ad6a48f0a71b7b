"""Rule train_clip: contrastive training of the tiny CLIP on the train split (shapes world)."""

from pathlib import Path

from distinctcap.core.io import read_table, write_json
from distinctcap.core.jobs import start_job
from distinctcap.train.clip import TrainSettings, save_weights, train_clip

# Weights the pipeline trained on the default config, taken only when their training fingerprint
# equals this run's (distinctcap.clip.assets; make ship-clip writes them). Found from this
# script, not a rule param: an absolute path there would retrain the CLIP, and everything
# below it, of an experiment folder whose workflow moved.
SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "clip"

device = start_job(snakemake, threads="all")
model, metrics = train_clip(
    read_table(snakemake.input.images, "images"),
    read_table(snakemake.input.captions, "captions"),
    snakemake.params.arch,
    TrainSettings(**snakemake.params.train),
    seed=snakemake.params.seed,
    device=device,
    checkpoint=snakemake.params.checkpoint,
    shipped=SHIPPED,
)
save_weights(model, snakemake.output.weights)
write_json(metrics, snakemake.output.retrieval)
