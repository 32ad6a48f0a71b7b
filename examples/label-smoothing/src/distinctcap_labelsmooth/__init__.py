"""Label smoothing on top of MLE, a distinctcap method plugin (docs/extending.md).

Light on purpose: distinctcap locates this package while Snakemake parses its workflow.
"""
