"""The headline metrics: the columns the evaluate job's log line, the README's headline table
and the report's verdicts show first, each (header, column, decimals, direction). Quality on
one decoding, diversity on a sampled one; every value on its metric's own scale (fractions stay
fractions). In evaluate/, whose log line reads them, below report/, whose tables do."""

HEADLINE_QUALITY = (
    ("BLEU-4", "bleu4", 3, "↑"), ("METEOR", "meteor", 3, "↑"), ("CIDEr", "cider", 3, "↑"),
    ("R@1", "r_at_1", 3, "↑"), ("mean rank", "mean_rank", 1, "↓"),
    ("CLIPScore", "clipscore", 2, "↑"), ("scene F1", "scene_f1", 3, "↑"),
)
HEADLINE_DIVERSITY = (("Div-2", "div2", 3, "↑"), ("distinct", "distinct", 3, "↑"))
