"""Scores that training and evaluation share, torch-free: CIDEr-D (`cider`), retrieval ranks
(`ranks`), the metric result types (`result`) and the field's distinctiveness metrics, CIDErBtw
and DisWordRate (`distinctive`). Imports nothing of distinctcap but core."""
