"""Rule split_entropy: top entropy.fraction of the ranked train captions -> D-, the rest D+."""

from distinctcap.core import logs
from distinctcap.features.subsets import split_stage

logs.setup(snakemake.log[0])
split_stage(
    snakemake.input.scores,
    snakemake.input.captions,
    dict(snakemake.output),
    fraction=snakemake.params.fraction,
    shard_size=snakemake.params.shard_size,
)
