"""Rule extract_captioner_features: the pre-trained captioner's frozen vision states as its grid."""

import torch

from distinctcap import logs
from distinctcap.devices import job_device
from distinctcap.features import FeatureSettings
from distinctcap.hf_captioner import extract_vision_features
from distinctcap.io import read_table

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
