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
# the field's distinctiveness metrics (evaluate.distinctive): by the judge CLIP's similar
# images, which the log line and the headline show after the quality columns where measured,
# and by the scene graphs', which the comparisons with the reference show too
HEADLINE_FIELD = (("CIDErBtw", "cider_btw", 3, "↓"), ("DisWordRate", "dis_word_rate", 3, "↑"))
FIELD_METRICS = (
    *HEADLINE_FIELD,
    ("CIDErBtw (scenes)", "cider_btw_scene", 3, "↓"),
    ("DisWordRate (scenes)", "dis_word_rate_scene", 3, "↑"),
)
