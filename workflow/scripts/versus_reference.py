"""Rule versus_reference: each run against the MLE reference with paired bootstrap CIs."""

from pathlib import Path

from distinctcap import logs
from distinctcap.io import read_table
from distinctcap.report.versus import compare_runs, write_versus

logs.setup(snakemake.log[0])
generated = {}
for path in map(Path, snakemake.input.generated):  # results/generated/{run}/{split}-{decoding}
    split, decoding = path.stem.split("-", 1)
    generated[(path.parent.name, split, decoding)] = read_table(path, "generated")
table = compare_runs(
    generated,
    read_table(snakemake.input.captions, "captions"),
    read_table(snakemake.input.images, "images"),
    snakemake.params.reference,
    snakemake.params.runs,
    seed=snakemake.params.seed,
)
out = snakemake.output
write_versus(table, snakemake.params.reference, Path(out.csv), Path(out.markdown), Path(out.latex))
