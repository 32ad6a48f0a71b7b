"""Published numbers of the four papers, transcribed as printed, for the reference blocks of
the report's tables (distinctcap.report.tables). All of them are MS COCO (or Flickr30K)
results of other models, other data and other retrieval systems: they frame our tables, they
are never compared number for number with a shapes-world run.

Each `Published` keeps the paper's own column headers, units and row labels; None marks a
"-" (not reported). `note` says what the numbers are and anything odd in the source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    paper: str  # short name: UNKT, CL, SMILE, specificity
    table: str  # "Table 1"
    dataset: str
    columns: tuple[str, ...]  # headers as printed, row label excluded
    rows: tuple[tuple[str, tuple[float | None, ...]], ...]
    note: str = ""
    digits: int | tuple[int, ...] = 1  # decimals as printed, per column or for all

    def formatted(self) -> list[list[str]]:
        """Rows as printed: label, then each value with its column's decimals ("-" if None)."""
        digits = self.digits
        if isinstance(digits, int):
            digits = (digits,) * len(self.columns)
        out = []
        for label, values in self.rows:
            pairs = zip(values, digits, strict=True)
            out.append([label, *("-" if v is None else f"{v:.{d}f}" for v, d in pairs)])
        return out

    def __post_init__(self) -> None:
        for label, values in self.rows:
            if len(values) != len(self.columns):
                raise ValueError(f"{self.paper} {self.table} row {label!r}: wrong width")


UNKT_COCO = "MS COCO (m-RNN split, UNKT §4.1)"
_UNKT_T1_COLUMNS = ("BLEU-4", "BLEU-3", "BLEU-2", "BLEU-1", "CIDEr", "ROUGE", "METEOR", "SPICE")
_UNKT_ABLATION_COLUMNS = ("B-4", "M", "C", "Div-1", "SelfCIDEr", "mB.")

UNKT_TABLE1 = {
    20: Published(
        "UNKT",
        "Table 1 (20 samples)",
        UNKT_COCO,
        _UNKT_T1_COLUMNS,
        (
            ("Div-BS", (38.3, 53.8, 68.7, 83.7, 140.5, 65.3, 35.7, 26.9)),
            ("POS", (44.9, 59.3, 73.7, 87.4, 146.8, 67.8, 36.5, 27.7)),
            ("AG-CVAE", (47.1, 57.3, 69.8, 83.4, 125.9, 63.8, 30.9, 24.4)),
            ("Seq-CVAE", (44.5, 59.1, 72.7, 87.0, 144.8, 67.1, 35.6, 27.9)),
            ("COS-CVAE", (50.0, 64.0, 77.1, 90.3, 162.4, 70.6, 38.7, 29.5)),
            ("Transformer-DML", (52.6, 66.3, 78.8, 91.5, 170.4, 72.6, 41.7, 32.5)),
            ("UNKT", (54.5, 68.5, 80.0, 92.0, 174.2, 73.8, 41.9, 33.0)),
            ("UNKT w/ memory", (55.8, 69.1, 80.4, 92.3, 176.4, 74.2, 43.9, 33.5)),
        ),
        "oracle (best-1 of n samples per image) quality, x100",
    ),
    100: Published(
        "UNKT",
        "Table 1 (100 samples)",
        UNKT_COCO,
        _UNKT_T1_COLUMNS,
        (
            ("Div-BS", (40.2, 55.5, 69.8, 84.6, 144.8, 66.6, 37.2, 29.0)),
            ("POS", (55.0, 67.2, 78.7, 90.9, 166.1, 72.5, 40.9, 31.1)),
            ("AG-CVAE", (55.7, 65.4, 76.7, 88.3, 151.7, 69.0, 34.5, 27.7)),
            ("Seq-CVAE", (57.5, 69.1, 80.3, 92.2, 169.5, 73.3, 41.0, 32.0)),
            ("LNFNN", (59.6, 69.5, 80.2, 92.0, 170.5, 72.9, 40.2, 31.6)),
            ("COS-CVAE", (63.3, 73.9, 84.2, 94.2, 189.3, 77.0, 45.0, 33.9)),
            ("Transformer-DML", (64.9, 75.0, 84.9, 94.6, 195.3, 78.0, 47.4, 35.4)),
            ("UNKT", (65.6, 75.5, 85.3, 94.9, 196.8, 78.4, 48.1, 35.7)),
            ("UNKT w/ memory", (66.1, 75.8, 85.5, 95.0, 197.5, 78.7, 48.7, 35.9)),
        ),
        "oracle (best-1 of n samples per image) quality, x100; 'LNFNN' as printed "
        "(Table 2 spells it LNFMM)",
    ),
}

UNKT_TABLE2 = Published(
    "UNKT",
    "Table 2",
    UNKT_COCO,
    ("Div-1", "Div-2", "SelfCIDEr", "mB. (lower is better)"),
    (
        ("LNFMM", (0.37, 0.50, None, 0.64)),
        ("COS-CVAE", (0.39, 0.57, 0.79, 0.53)),
        ("Seq-CVAE", (0.33, 0.48, None, 0.64)),
        ("Transformer-BS", (0.21, 0.29, 0.57, 0.78)),
        ("Transformer-DML", (0.43, 0.59, 0.83, 0.54)),
        ("UNKT", (0.46, 0.63, 0.85, 0.50)),
        ("UNKT w/ memory", (0.45, 0.60, 0.83, 0.53)),
    ),
    "diversity of the best-5 captions after consensus re-ranking",
    digits=2,
)

# Tables 3-6 and 8 share one layout: oracle B-4 / METEOR / CIDEr (x100, 20 samples, matching
# Table 1) and the best-5 diversity of Table 2.
UNKT_ABLATIONS = (
    Published(
        "UNKT",
        "Table 3",
        UNKT_COCO,
        _UNKT_ABLATION_COLUMNS,
        (
            ("UNKT", (54.5, 41.9, 174.2, 0.46, 0.85, 0.50)),
            ("w/o L_pred", (55.3, 43.0, 175.5, 0.45, 0.83, 0.54)),
            ("w/o L_att", (54.9, 42.4, 174.8, 0.43, 0.82, 0.54)),
            ("w/o L_hid", (53.6, 40.4, 172.5, 0.41, 0.80, 0.57)),
            ("w/o L_neg (MLE)", (44.9, 36.4, 145.7, 0.22, 0.58, 0.79)),
        ),
        "ablation of the transfer objectives",
        digits=(1, 1, 1, 2, 2, 2),
    ),
    Published(
        "UNKT",
        "Table 4",
        UNKT_COCO,
        _UNKT_ABLATION_COLUMNS,
        (
            ("p_n^- (trained on D-)", (39.2, 35.3, 138.2, 0.18, 0.55, 0.80)),
            ("p_n^+ (trained on D+)", (42.3, 36.5, 144.2, 0.32, 0.63, 0.64)),
        ),
        "MLE teachers on the entropy subsets; the first row is printed as p_n, the text calls "
        "it p^-",
        digits=(1, 1, 1, 2, 2, 2),
    ),
    Published(
        "UNKT",
        "Table 5",
        UNKT_COCO,
        _UNKT_ABLATION_COLUMNS,
        (
            ("p_s^- (teacher p_n^-)", (54.5, 41.9, 174.2, 0.46, 0.85, 0.50)),
            ("p_s^+ (teacher p_n^+)", (54.2, 41.5, 173.7, 0.31, 0.63, 0.65)),
        ),
        "students of each teacher; the source's header row is garbled, columns as Tables 3-4",
        digits=(1, 1, 1, 2, 2, 2),
    ),
    Published(
        "UNKT",
        "Table 6",
        UNKT_COCO,
        _UNKT_ABLATION_COLUMNS,
        (
            ("Random", (52.5, 39.2, 168.3, 0.38, 0.77, 0.61)),
            ("Hard", (54.4, 41.7, 174.0, 0.45, 0.83, 0.52)),
            ("Soft", (54.5, 41.9, 174.2, 0.46, 0.85, 0.50)),
        ),
        "negative targets: random D- captions, the teacher's greedy caption, soft targets",
        digits=(1, 1, 1, 2, 2, 2),
    ),
    Published(
        "UNKT",
        "Table 8",
        UNKT_COCO,
        _UNKT_ABLATION_COLUMNS,
        (
            ("Fixed lambda", (54.3, 41.6, 173.9, 0.43, 0.82, 0.55)),
            ("Progressive", (54.5, 41.9, 174.2, 0.46, 0.85, 0.50)),
        ),
        "progressive vs fixed lambda = 0.5",
        digits=(1, 1, 1, 2, 2, 2),
    ),
)

CL_COCO = "MS COCO (Karpathy test split, CL §4)"
# CL §5.2: "All experiments for ablation studies are conducted on the validation set of
# MSCOCO", the 2,000 images CL reserves for validation (§5.1), not the test split
CL_COCO_VAL = "MS COCO (CL's own 2,000-image validation split, CL §5.1-5.2)"

CL_TABLE1 = Published(
    "CL",
    "Table 1",
    CL_COCO,
    ("Self retrieval R@1 (%)", "R@5 (%)", "R@50 (%)", "R@500 (%)", "ROUGE_L", "CIDEr"),
    (
        ("Neuraltalk2", (0.02, 0.32, 3.02, 27.50, 0.652, 0.827)),
        ("AdaptiveAttention", (0.10, 0.96, 11.76, 78.46, 0.689, 1.004)),
        ("AdaptiveAttention + CL", (0.32, 1.18, 11.84, 80.96, 0.695, 1.029)),
    ),
    "self retrieval ranks all 5,000 test images by the captioner's own log p(c | I) (§4.1)",
    digits=(2, 2, 2, 2, 3, 3),
)

CL_TABLE4 = Published(
    "CL",
    "Table 4",
    CL_COCO_VAL,
    ("B-1", "B-2", "B-3", "B-4", "METEOR", "ROUGE_L", "CIDEr"),
    (
        ("AdaptiveAttention (Base)", (0.733, 0.572, 0.433, 0.327, 0.260, 0.540, 1.042)),
        ("Base + IL", (0.706, 0.544, 0.408, 0.307, 0.253, 0.530, 1.004)),
        ("Base + GAN", (0.629, 0.437, 0.290, 0.190, 0.212, 0.458, 0.700)),
        ("Base + CL(P)", (0.735, 0.573, 0.437, 0.334, 0.262, 0.545, 1.059)),
        ("Base + CL(N)", (0.539, 0.411, 0.299, 0.212, 0.246, 0.479, 0.603)),
        ("Base + CL(Full)", (0.755, 0.598, 0.460, 0.353, 0.271, 0.559, 1.142)),
    ),
    "one caption per image; fractions, as printed",
    digits=3,
)

_SMILE_COLUMNS = (
    "Caption Length",
    "Lexical Diversity",
    "R@1",
    "R@5",
    "CLIPScore",
    "PPL",
)
SMILE_TABLE1 = (
    Published(
        "SMILE",
        "Table 1",
        "MS COCO (Karpathy test split)",
        _SMILE_COLUMNS,
        (
            ("NliCap", (9.5, 0.8, 2.9, 9.3, 75.5, 67.8)),
            ("GdisCap", (9.5, 1.0, 3.5, 10.8, 75.8, 100.2)),
            ("CapEnrich", (13.3, 1.5, 9.4, 22.6, 79.2, 63.1)),
            ("BLIP", (10.0, 1.4, 6.7, 16.6, 77.2, 95.8)),
            ("BLIP-L_SMILE", (22.3, 4.5, 10.0, 24.5, 75.0, 95.6)),
            ("Human", (10.4, 4.1, 7.6, 20.0, 77.6, 129.1)),
        ),
        "CLIP self-retrieval R@k (%) in CapEnrich's hard pool (test images plus similar ones), "
        "CLIPScore x100, GPT-2 perplexity; lexical diversity is 'unique word count of all "
        "captions', printed in units the paper does not state (presumably thousands)",
    ),
    Published(
        "SMILE",
        "Table 1",
        "Flickr30K (test split)",
        _SMILE_COLUMNS,
        (
            ("CapEnrich", (15.2, 1.0, 29.2, 54.9, 81.5, 67.1)),
            ("BLIP", (11.6, 0.8, 25.4, 46.4, 78.8, 65.6)),
            ("BLIP-L_SMILE", (23.2, 2.3, 31.2, 53.0, 78.2, 98.0)),
            ("Human", (12.3, 2.0, 26.2, 48.3, 79.8, 121.2)),
        ),
        "as the MS COCO block",
    ),
)

SPEC_COCO = "MS COCO (Karpathy test split, specificity paper §4.1)"

SPECIFICITY_TABLE1 = Published(
    "specificity",
    "Table 1",
    SPEC_COCO,
    ("Diversity (%)", "Novelty (%)", "Vocab Size", "R@1 (%)", "R@5 (%)", "R@10 (%)", "Mean Rank"),
    (
        ("D-ME+DMSM", (47.0, 70.0, None, None, None, None, None)),
        ("Adv-samp", (None, 73.9, 1616, None, None, None, None)),
        ("DP", (79.12, 76.66, 1029, 10.38, 31.38, 44.48, 33.70)),
        ("Cos", (79.16, 76.66, 1034, 10.04, 30.66, 43.54, 35.25)),
        ("CDP", (84.48, 77.49, 1064, 12.80, 36.16, 49.67, 32.79)),
        ("CCos", (84.37, 77.29, 1052, 12.53, 36.19, 50.00, 32.30)),
        ("Baseline", (76.26, 69.08, 812, 10.82, 30.42, 43.32, 39.25)),
    ),
    "diversity = share of distinct captions over the test set, novelty = share not found in "
    "the training set; R@k and mean rank by the paper's own retrieval model",
    digits=(2, 2, 0, 2, 2, 2, 2),
)

SPECIFICITY_TABLE3 = Published(
    "specificity",
    "Table 3",
    SPEC_COCO,
    ("B-1", "B-2", "B-3", "B-4", "R-L", "M", "C", "S"),
    (
        ("D-ME+DMSM", (None, None, None, 0.257, None, 0.236, None, None)),
        ("Adv-samp", (None, None, None, None, None, 0.236, None, 0.166)),
        ("CVAE", (0.698, 0.521, 0.372, 0.265, 0.506, 0.225, 0.834, 0.158)),
        ("GMM-CVAE", (0.718, 0.538, 0.388, 0.278, 0.516, 0.238, 0.932, 0.170)),
        ("AG-CVAE", (0.716, 0.537, 0.391, 0.286, 0.517, 0.239, 0.953, 0.172)),
        ("DP", (0.725, 0.556, 0.409, 0.297, 0.527, 0.247, 0.953, 0.184)),
        ("Cos", (0.725, 0.556, 0.409, 0.297, 0.527, 0.247, 0.953, 0.184)),
        ("CDP", (0.736, 0.564, 0.417, 0.306, 0.533, 0.251, 0.977, 0.188)),
        ("CCos", (0.737, 0.565, 0.419, 0.307, 0.533, 0.253, 0.980, 0.188)),
        ("Baseline", (0.746, 0.579, 0.432, 0.320, 0.545, 0.262, 1.036, 0.197)),
    ),
    "single best caption per image; fractions, as printed",
    digits=3,
)
