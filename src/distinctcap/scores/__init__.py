"""Scores that training and evaluation share, torch-free: CIDEr-D (`cider`), retrieval ranks
(`ranks`) and the metric result types (`result`). Imports nothing of distinctcap but core."""
