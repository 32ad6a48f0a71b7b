"""SCST's bad endings (issue 58): which shapes-world captions end badly, and the table over
seeds that `make scst-endings` prints (report.endings), on hand-made results folders."""

import math

import pandas as pd
import pytest

from distinctcap.core.io import write_table
from distinctcap.data.scene import ends_badly
from distinctcap.report.endings import endings_table, main, pooled


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("a red circle left of a blue square", False),
        ("a small green triangle on a grey background", False),
        ("a picture of some shapes", False),
        ("a red circle left of a blue", True),  # a colour with no shape after it
        ("a red circle left of", True),  # a relation with no object after it (and "of")
        ("a red circle left of a", True),  # ends on a function word
        ("a large", True),
        ("", True),
    ],
)
def test_a_caption_ends_badly_when_its_parse_is_left_open_or_it_ends_on_a_function_word(
    text, bad
):
    assert ends_badly(text) is bad


def write_model(results, model, greedy, samples, cider=None):
    for decoding, texts in (("greedy", greedy), ("sample20", samples)):
        table = pd.DataFrame({"run": model, "image_id": range(len(texts)), "sample": 0,
                              "text": texts, "logprob": -1.0})  # fmt: skip
        write_table(table, results / "generated" / model / f"test-{decoding}.parquet", "generated")
    if cider is not None:
        write_table(pd.DataFrame({"run": [model], "cider": [cider]}),
                    results / "metrics" / model / "test-greedy.parquet")  # fmt: skip


def test_the_table_pools_each_arms_seeds(tmp_path, capsys):
    whole, cut = "a red circle left of a blue square", "a red circle left of a"
    write_model(tmp_path, "scst", [whole, whole], [whole, cut, cut, cut], cider=1.2)
    write_model(tmp_path, "scst_s1", [whole, cut], [cut] * 4, cider=1.0)
    write_model(tmp_path, "scst_noend", [cut, cut], [cut] * 4)  # not evaluated yet
    write_model(tmp_path, "reference", [whole] * 2, [whole] * 4, cider=0.9)  # not asked for
    table = endings_table(tmp_path, ["scst", "scst_noend"]).set_index("model")
    assert table.loc["scst", ["arm", "greedy", "sample20"]].tolist() == ["scst", 0.0, 0.75]
    assert table.loc["scst_s1", ["arm", "greedy", "sample20", "cider"]].tolist() == [
        "scst", 0.5, 1.0, 1.0]  # fmt: skip
    assert math.isnan(table.loc["scst_noend", "cider"]) and "reference" not in table.index
    headers, rows = pooled(table.reset_index(), ["scst", "scst_noend"])
    assert headers == ["arm", "models", "bad endings (greedy)", "bad endings (sample20)",
                       "greedy CIDEr"]  # fmt: skip
    assert rows == [["scst", "2", "0.250 ± 0.354", "0.875 ± 0.177", "1.100 ± 0.141"],
                    ["scst_noend", "1", "1.000", "1.000", "-"]]  # fmt: skip
    main([str(tmp_path), "scst", "scst_noend"])
    assert "| scst | 2 | 0.250 ± 0.354 |" in capsys.readouterr().out
