"""distinctcap: distinctive image captioning pipeline (UNKT, CL, SMILE, specificity)."""

__version__ = "0.1.0"
