"""Rule extract_captioner_features: the pre-trained captioner's frozen vision states as its grid."""

import torch

from distinctcap.core import logs
from distinctcap.core.devices import job_device
from distinctcap.core.io import read_table
from distinctcap.features.captioner import extract_vision_features
from distinctcap.features.extract import FeatureSettings

logs.setup(snakemake.log[0])
device = str(job_device(snakemake.params.device, snakemake.resources.get("gpu", 0)))
torch.set_num_threads(snakemake.threads if device.startswith("cuda") else 1)  # as extract_features
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
