"""Rule extract_features: pooled + grid image features and text features, in shards."""

import torch

from distinctcap import logs
from distinctcap.clip import load_clip
from distinctcap.features import FeatureSettings, extract_features
from distinctcap.io import read_table

logs.setup(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
extract_features(
    read_table(snakemake.input.images, "images"),
    read_table(snakemake.input.captions, "captions"),
    load_clip(snakemake.params.arch, snakemake.params.pretrained),
    index_path=snakemake.output.index,
    cache_dir=snakemake.params.cache,
    settings=FeatureSettings(**snakemake.params.settings),
    device=snakemake.params.device,
)
