"""Rule extract_features: pooled + grid image features and text features, in shards."""

from distinctcap.clip.load import load_clip
from distinctcap.core.io import read_table
from distinctcap.core.jobs import start_job
from distinctcap.features.extract import FeatureSettings, extract_features

# The job's CPUs (the rule asks for all it may have): on a GPU, DataLoader workers decoding
# images (FeatureSettings.workers auto) and the main process. On the CPU one torch thread, as
# always: CPU features then do not depend on the machine's core count (a conv's sums split over
# threads differ in the last bit), and the tiny CLIP is fastest on one.
device = start_job(snakemake, threads="all-on-cuda")
extract_features(
    read_table(snakemake.input.images, "images"),
    read_table(snakemake.input.captions, "captions"),
    load_clip(snakemake.params.arch, snakemake.params.pretrained, tag=snakemake.params.tag),
    index_path=snakemake.output.index,
    cache_dir=snakemake.params.cache,
    settings=FeatureSettings(**snakemake.params.settings),
    device=device,
    threads=snakemake.threads,
)
