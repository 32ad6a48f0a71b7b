"""Rule versus_reference: each run against the MLE reference with paired bootstrap CIs."""

from pathlib import Path

from distinctcap.core import logs
from distinctcap.core.io import read_table
from distinctcap.report.plots import plot_forest
from distinctcap.report.verdicts import methods_first, versus_decoding
from distinctcap.report.versus import HEADERS, compare_runs, write_versus

logs.setup(snakemake.log[0])
generated, per_image = {}, {}
# results/generated/{run}/{split}-{decoding}.parquet and, at the same position, its
# results/metrics/{run}/{split}-{decoding}-per_image.parquet
for path, table in zip(map(Path, snakemake.input.generated), snakemake.input.per_image,
                       strict=True):
    split, decoding = path.stem.split("-", 1)
    key = (path.parent.name, split, decoding)
    generated[key] = read_table(path, "generated")
    per_image[key] = read_table(table, "per_image")
spaces = {}
if "judge_features" in snakemake.input.keys():  # the judge CLIP's similar images
    from distinctcap.features.pooled import read_pooled

    path = snakemake.input.judge_features
    spaces[""] = lambda ids: read_pooled(path, ids)[0]
table = compare_runs(
    generated,
    read_table(snakemake.input.captions, "captions"),
    read_table(snakemake.input.images, "images"),
    snakemake.params.reference,
    snakemake.params.runs,
    seed=snakemake.params.seed,
    per_image=per_image,
    seed_of=snakemake.params.seed_of,
    spaces=spaces,
)
out = snakemake.output
write_versus(table, snakemake.params.reference, Path(out.csv), Path(out.markdown), Path(out.latex))
order = methods_first(snakemake.params.runs)
plot_forest(table, order, versus_decoding(table, "greedy"), HEADERS, out.forest)
