"""Decode a split's images with a run's model under each decoding setting
(distinctcap.evaluate.decode):
one job per run, one output per (split, decoding) in the rule's order."""

from distinctcap.core.jobs import start_job
from distinctcap.evaluate.decode import decode_run

device = start_job(snakemake, threads="all")
outputs = snakemake.output.generated
for (split, _, setting), out in zip(snakemake.params.decodes, outputs, strict=True):
    decode_run(
        snakemake.input.model,
        snakemake.input.features,
        snakemake.input.images,
        snakemake.input.vocab,
        out,
        run=snakemake.wildcards.run,
        split=split,
        setting=setting,
        seed=snakemake.params.seed,
        device=device,
    )
