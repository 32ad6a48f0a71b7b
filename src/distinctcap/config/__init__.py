"""The config as the workflow sees it: validation across stages, the run graph, seeds, each
run's effective config and the scheduling priorities (ARCHITECTURE.md, "Runs are data").

A layer above the stages whose facts it reads (the methods' facts, the selection metrics) and
below report/ and runs/; torch-free, for Snakemake's parse."""
