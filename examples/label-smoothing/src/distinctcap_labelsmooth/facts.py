"""The facts of `method: label_smoothing`, read without torch while Snakemake parses the
workflow: no edges (it trains from scratch like the MLE reference), its options from its own
schema (schemas/methods/label_smoothing.yaml), and where its objective is."""

from __future__ import annotations

from distinctcap.core.schema import method_options
from distinctcap.methods.base import Objective


class LabelSmoothing(Objective):
    """MLE against smoothed targets (Szegedy et al. 2016, §7)."""

    options = method_options("label_smoothing")
    objective_class = "distinctcap_labelsmooth.objective:LabelSmoothing"
