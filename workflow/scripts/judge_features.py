"""Rule judge_features: the judge CLIP's pooled embeddings of the val and test images."""

from distinctcap.clip.load import load_clip
from distinctcap.core.io import read_table
from distinctcap.core.jobs import start_job
from distinctcap.features.extract import FeatureSettings
from distinctcap.features.pooled import extract_pooled

# as extract_features: DataLoader workers on a GPU, one torch thread on the CPU
device = start_job(snakemake, threads="all-on-cuda")
extract_pooled(
    read_table(snakemake.input.images, "images"),
    load_clip(snakemake.params.arch, snakemake.params.pretrained, tag=snakemake.params.tag),
    snakemake.output.features,
    settings=FeatureSettings(**snakemake.params.settings),
    device=device,
    threads=snakemake.threads,
)
