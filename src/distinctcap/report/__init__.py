"""Side-by-side report of every run, one module per report rule (workflow/rules/report.smk),
all wired into `snakemake --report`:

- summary: the summary table (rule `summarize`) and the DAG-parse-time helpers
  `evaluation_keys` and `reference_run`; light, no torch or matplotlib.
- tables: our runs in the papers' table layouts beside their published numbers, and each run
  against the MLE reference (rule `report_tables`: tables.md, tables.html).
- plots: training curves, metric bars, CIDEr vs number of samples (rule `report_plots`).
- gallery: images with every run's captions, PNG and HTML (rule `report_gallery`).
- front: the report's front page (the Snakefile's `report:`), headline table first.
- browser: the built report.html in headless Chromium (DOM, screenshot); no rule, used by
  tools/report_screenshot.py and the tests.

Import from the module that owns a function; this package re-exports nothing.
"""
