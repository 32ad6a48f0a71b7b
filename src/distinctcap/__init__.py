"""distinctcap: distinctive image captioning pipeline (UNKT, CL, SMILE, specificity).

    from distinctcap import load_run
    run = load_run("results/runs/smile")
    run.caption(["img.jpg"])

Importing the package stays light (no torch): the rule files import its modules while
Snakemake parses the DAG; `load_run` imports the captioning code when called.
"""

__version__ = "0.1.0"


def load_run(run_dir, clip: str | None = None, device: str = "auto"):
    """A trained run folder (results/runs/<run>) ready to caption images: a
    distinctcap.runs.caption.Run. `clip` points at the run's CLIP if it moved."""
    from distinctcap.runs.caption import Run

    return Run(run_dir, clip=clip, device=device)
