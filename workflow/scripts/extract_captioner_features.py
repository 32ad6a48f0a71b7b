"""Rule extract_captioner_features: the pre-trained captioner's frozen vision states as its grid."""

from distinctcap.core.io import read_table
from distinctcap.core.jobs import start_job
from distinctcap.features.captioner import extract_vision_features
from distinctcap.features.extract import FeatureSettings

device = start_job(snakemake, threads="all-on-cuda")
extract_vision_features(
    read_table(snakemake.input.images, "images"),
    snakemake.params.pretrained,
    index_path=snakemake.output.index,
    cache_dir=snakemake.params.cache,
    settings=FeatureSettings(**snakemake.params.settings),
    device=device,
    threads=snakemake.threads,
    vision=snakemake.params.vision,
)
