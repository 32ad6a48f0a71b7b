"""Rule train_clip: contrastive training of the tiny CLIP on the train split (shapes world)."""

from distinctcap.clip.train import TrainSettings, save_weights, train_clip
from distinctcap.core.io import read_table, write_json
from distinctcap.core.jobs import start_job

device = start_job(snakemake, threads="all")
model, metrics = train_clip(
    read_table(snakemake.input.images, "images"),
    read_table(snakemake.input.captions, "captions"),
    snakemake.params.arch,
    TrainSettings(**snakemake.params.train),
    seed=snakemake.params.seed,
    device=device,
    checkpoint=snakemake.params.checkpoint,
    shipped=snakemake.params.shipped,
)
save_weights(model, snakemake.output.weights)
write_json(metrics, snakemake.output.retrieval)
