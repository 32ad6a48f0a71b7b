"""Where the time goes: every rule writes a Snakemake benchmark (wall, peak memory, CPU
seconds) under benchmarks/; report_times, which runs after every other target, turns them into
the per-rule table of the report (`make times` prints the same table)."""

OTHER_TARGETS = list(ALL_TARGETS)  # every target but this rule's own: it runs last


rule report_times:
    input:
        OTHER_TARGETS,
    output:
        markdown=f"{REPORT}/times.md",
        csv=report(f"{REPORT}/times.csv", caption="../report/times.rst", category="Run time"),
    log:
        "logs/report_times.log",
    benchmark:
        "benchmarks/report_times.tsv"
    conda:
        "../../envs/eval.yaml"
    params:
        benchmarks="benchmarks",
    script:
        "../scripts/report_times.py"


ALL_TARGETS.extend(rules.report_times.output)
