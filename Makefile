# Two commands from a fresh clone: `make run` (pipeline on the embedded default) and
# `make test` (the test suite). Both create .venv from the committed requirements first.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
export HF_HUB_OFFLINE ?= 1
export MPLBACKEND ?= Agg

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

.PHONY: install run test report readme-table cleanup
install: $(VENV)/.installed

run: install
	$(VENV)/bin/snakemake --cores $(CORES)

report: run
	$(VENV)/bin/snakemake --cores $(CORES) --report results/report.html

test: install
	$(PY) -m pytest -q

# The README's results table, rendered from the run's summary (paste it; never edit numbers).
readme-table: install
	$(PY) -m distinctcap.report.summary results/metrics/summary.csv config.yaml

# Delete the downloaded COCO zips (~38 GB) whose extraction finished; others are kept.
COCO_DIR ?= resources/coco
cleanup: install
	$(PY) -c 'from distinctcap.data.coco import remove_extracted_zips as r; print(*r("$(COCO_DIR)"))'
