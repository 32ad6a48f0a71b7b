# From a fresh clone: `make quick` (a first run in minutes), `make run` (the pipeline on the
# embedded default) and `make test` (the test suite). Each creates .venv first.
# One folder per experiment: EXP=experiments/NAME CONFIGS="presets/X.yaml" runs config.yaml
# overlaid with the presets in that folder (snakemake --directory), so runs never overwrite
# each other; the folder records its CONFIGS, so `make report EXP=...` and `make run EXP=...`
# reuse them (results/experiment.json) and refuse other ones.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
# pytest-xdist workers of `make test` (tests/conftest.py groups the tests that share a fixture)
TEST_WORKERS ?= 2
EXP ?= .
CONFIGS ?=
# Snakemake reads --configfile files before the workflow and names neither file nor line of a
# YAML error in one: check-config does, first
CHECK_YAML = $(PY) -m distinctcap check-config --syntax config.yaml
EXP_CONFIGS = $(PY) -m distinctcap.runs.experiments $(EXP) --configs "$(CONFIGS)"
# --rerun-incomplete: a job cut short (Ctrl-C) reruns when the command is typed again
SNAKEMAKE = $(CHECK_YAML) $(CONFIGS) && $(VENV)/bin/snakemake --cores $(CORES) --rerun-incomplete --directory $(EXP) $(if $(CONFIGS),--configfile $(CONFIGS))
# Before a snakemake command line: a Ctrl-C ends on one line saying how to resume ($(1): the
# make command; Snakemake's own lines about the interrupt come before it, and make then stops)
RESUME_ON_CTRL_C = trap 'echo "interrupted: \`$(1)\` again resumes (finished jobs are kept; training continues from its last checkpoint)" >&2; exit 0' INT;
QUICK := experiments/quick
# presets/quick.yaml's only_runs keeps the reference and SMILE: the summary, the comparison
# (versus.csv, forest.png) and the plots hold those two
QUICK_TARGETS := $(foreach run,reference smile,results/runs/$(run)/run.json) \
	results/metrics/summary.csv results/report/versus.csv results/report/metric_bars.png
export HF_HUB_OFFLINE ?= 1
export MPLBACKEND ?= Agg

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

.PHONY: install run plan quick quick-tail try tensorboard test report report-screenshot readme-table unkt-ablations unkt-ablation-table unkt-seeds unkt-seeds-table scst scst-table scst-endings seeds cleanup times timeline ship-clip ship-judge gpu-wheels gpu-rehearsal
install: $(VENV)/.installed

# A rerun of EXP without CONFIGS uses the config files recorded in it (results/experiment.json);
# CONFIGS that differ from them are refused in one line printing the right command. Then the
# report (built quietly), every method against the reference and where the results are.
run: install
	@$(call RESUME_ON_CTRL_C,make run$(if $(filter-out .,$(EXP)), EXP=$(EXP))$(if $(CONFIGS), CONFIGS='\''$(CONFIGS)'\'')) \
	configs=$$($(EXP_CONFIGS) --make run) && $(CHECK_YAML) $$configs && \
	$(VENV)/bin/snakemake --cores $(CORES) --rerun-incomplete --directory $(EXP) \
	$$(if [ -n "$$configs" ]; then echo --configfile $$configs; fi)
	$(call tail_of,$(EXP),$(CONFIGS))

# what `make run` with the same EXP and CONFIGS (none: those recorded in EXP) would redo, per
# rule and why (docs/pipeline.md)
plan: install
	@configs=$$($(EXP_CONFIGS) --make run) && $(PY) -m distinctcap plan -- --directory $(EXP) \
	$$(if [ -n "$$configs" ]; then echo --configfile $$configs; fi)

# The MLE reference and its SMILE fine-tune on a small world (presets/quick.yaml), the
# captions both give six test images, then the summary, SMILE against the reference and the
# report of the two, and where each is.
quick: install
	$(CHECK_YAML) presets/quick.yaml
	@$(call RESUME_ON_CTRL_C,make quick) $(VENV)/bin/snakemake $(QUICK_TARGETS) --cores $(CORES) --rerun-incomplete --directory $(QUICK) --configfile presets/quick.yaml
	@$(MAKE) --no-print-directory quick-tail

# Your method beside the reference and SMILE on the quick world (docs/extending.md, "Trying
# it"): presets/try.yaml's run, here the example plugin's (installed first), then the report and
# each method's verdict against the reference.
TRY := experiments/try
try: install
	$(PY) -m pip install --quiet --no-deps -e examples/label-smoothing
	@$(MAKE) --no-print-directory run EXP=$(TRY) CONFIGS="presets/quick.yaml presets/try.yaml"

# make quick after its jobs: also the end of the quick-path test (tests/test_quick.py)
quick-tail:
	@for run in reference smile; do echo "== captions of $$run"; $(PY) -m distinctcap caption $(QUICK)/results/runs/$$run $$(ls $(QUICK)/results/data/images/*.png | tail -n 6); done
	$(call tail_of,$(QUICK),presets/quick.yaml)
	@echo "runs:       $(QUICK)/results/runs/reference, $(QUICK)/results/runs/smile"

# The end of make quick and make run: the report of experiment folder $(1) with presets $(2),
# Snakemake's lines about it in $(1)/logs/report.log, then every method against the reference
# (distinctcap compare: the headline table and the verdicts) and where the results are, so
# the verdict and the paths are the last lines.
results_of = $(if $(filter .,$(1)),,$(1)/)results
define tail_of
$(call quiet_report_of,$(1),$(2))
@echo "== against the reference"
@$(PY) -m distinctcap compare --results $(call results_of,$(1))
@echo "== where they are"
@echo "summary:    $(call results_of,$(1))/metrics/summary.csv"
@echo "comparison: $(call results_of,$(1))/report/versus.md (distinctcap compare prints it again)"
@echo "report:     $(call results_of,$(1))/report.html (Snakemake's log of it: $(call report_log,$(1)))"
endef

# The report of experiment folder $(1) with presets $(2) (none: those recorded in it),
# Snakemake's output in its log file (report_log); a failure says where that log is.
report_log = $(if $(filter .,$(1)),,$(1)/)logs/report.log
define quiet_report_of
@mkdir -p $(dir $(call report_log,$(1))) && { \
  configs=$$($(PY) -m distinctcap.runs.experiments $(1) --configs "$(2)" --make run) && \
  $(CHECK_YAML) $$configs && $(VENV)/bin/snakemake --cores $(CORES) --directory $(1) \
  $$(if [ -n "$$configs" ]; then echo --configfile $$configs; fi) --report results/report.html; } \
  > $(call report_log,$(1)) 2>&1 || { echo "the report failed: see $(call report_log,$(1))" >&2; exit 1; }
endef

# Reports what the experiment folder holds; runs nothing (make run first for a full report).
# Without results in $(EXP) it says so in one line, naming the folders that have them.
report: install
	$(call report_of,$(EXP),$(CONFIGS),)

# The report of experiment folder $(1) with presets $(2) (none: those recorded in it) and
# snakemake options $(3), or the one line saying there is nothing to report or that $(2) is
# not what the folder was made with (distinctcap.runs.experiments)
define report_of
@configs=$$($(PY) -m distinctcap.runs.experiments $(1) --configs "$(2)" --make report) || \
  { said=$$?; [ -z "$$configs" ] || echo "$$configs"; exit $$((said == 1 ? 0 : 1)); }; \
  $(CHECK_YAML) $$configs && $(VENV)/bin/snakemake --cores $(CORES) --directory $(1) \
  $$(if [ -n "$$configs" ]; then echo --configfile $$configs; fi) $(3) \
  --report results/report.html && echo "report: $(1)/results/report.html"
endef

# The shipped screenshot of the report's front page (assets/report_front.png, the README's),
# from the report of REPORT_EXP (make quick's by default; make report builds it) in headless
# Chromium, 1400 x 1000 as the front-page test checks it.
REPORT_EXP ?= $(QUICK)
report-screenshot: install
	$(PY) tools/report_screenshot.py $(REPORT_EXP)/results/report.html assets/report_front.png --width 1400 --height 1000

test: install
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# The README's results table, rendered from the run's summary (paste it; never edit numbers).
readme-table: install
	$(PY) -m distinctcap.report.summary results/metrics/summary.csv config.yaml

# The UNKT sampled-quality table (docs/unkt-sampled-captions.md) of the arms evaluated so far
# (make unkt-ablations trains the ten it reports; plain snakemake with the preset trains all).
UNKT_ARMS := unkt_wo_pred unkt_wo_att unkt_wo_hid unkt_fixed_lambda unkt_pred_only unkt_exclude_gold unkt_t2 unkt_sum unkt_top5 unkt_lambda_fast
unkt-ablations: install
	$(CHECK_YAML) presets/unkt-ablations.yaml
	$(SNAKEMAKE) --configfile config.yaml presets/unkt-ablations.yaml -- $(foreach run,$(UNKT_ARMS),$(foreach d,greedy beam3 sample20,results/metrics/$(run)/test-$(d).parquet))

unkt-ablation-table: install
	$(PY) -m distinctcap.report.summary --unkt-ablation $(EXP)/results/metrics config.yaml presets/unkt-ablations.yaml

# Issue 29: the two readings of UNKT's negative captions (gold, teacher) and the reference, each
# over seeds 0-2 (docs/unkt-sampled-captions.md); the table pools each arm's seeds (mean ± sd).
SEED_ARMS := reference reference_s1 reference_s2 unkt_gold unkt_gold_s1 unkt_gold_s2 unkt_teacher unkt_teacher_s1 unkt_teacher_s2
unkt-seeds: install
	$(SNAKEMAKE) --configfile config.yaml presets/unkt-ablations.yaml -- $(foreach run,$(SEED_ARMS),$(foreach d,greedy beam3 sample20,results/metrics/$(run)/test-$(d).parquet))

unkt-seeds-table: install
	$(PY) -m distinctcap.report.summary --seeds $(EXP)/results/metrics config.yaml presets/unkt-ablations.yaml

# Self-critical training (issue 49, presets/scst.yaml, docs/methods.md): the SCST arms (seeds
# 0-2 for scst and scst_retrieval) and CL / SMILE / specificity / UNKT started from `scst`,
# each decoded and evaluated; scst-table renders the headline table of those finished so far
# and the SCST effects over seeds (report.effects SCST_EFFECTS; intervals where make report
# wrote versus.csv with the preset).
SCST_RUNS := scst scst_s1 scst_s2 scst_retrieval scst_retrieval_s1 scst_retrieval_s2 scst_clipscore cl_on_scst smile_on_scst specificity_on_scst unkt_on_scst
scst: install
	$(CHECK_YAML) presets/scst.yaml
	$(SNAKEMAKE) --configfile config.yaml presets/scst.yaml -- $(foreach run,reference reference_s1 reference_s2 $(SCST_RUNS),$(foreach d,greedy beam3 sample20,results/metrics/$(run)/test-$(d).parquet))

scst-table: install
	$(PY) -m distinctcap.report.summary $(EXP)/results/metrics config.yaml presets/scst.yaml
	$(PY) -m distinctcap.report.effects --scst $(EXP)/results/metrics $(EXP)/results/report/versus.csv --configs config.yaml presets/scst.yaml

# SCST's bad endings with and without the end token in its reward (issue 58,
# presets/scst-end-token.yaml, docs/methods.md): both arms over seeds 0-2, then their table
ENDING_RUNS := scst scst_s1 scst_s2 scst_noend scst_noend_s1 scst_noend_s2
scst-endings: install
	$(CHECK_YAML) presets/scst.yaml presets/scst-end-token.yaml
	$(SNAKEMAKE) --configfile config.yaml presets/scst.yaml presets/scst-end-token.yaml -- $(foreach run,$(ENDING_RUNS),$(foreach d,greedy sample20,results/metrics/$(run)/test-$(d).parquet))
	$(PY) -m distinctcap.report.endings $(EXP)/results scst scst_noend

# The shapes default over training seeds 0-2 (presets/seeds.yaml, docs/seeds.md): seed 0 is the
# default's own models (not retrained), seeds 1-2 are <run>_s1/_s2; then the headline table
# with each cell's mean ± sd over the seeds (n), and which of the README's ten effects hold
# on every seed (report.effects).
seeds: install
	$(CHECK_YAML) presets/seeds.yaml
	$(SNAKEMAKE) --configfile config.yaml presets/seeds.yaml
	$(PY) -m distinctcap.report.summary $(EXP)/results/metrics/summary.csv config.yaml presets/seeds.yaml
	$(PY) -m distinctcap.report.effects $(EXP)/results/metrics/summary.csv $(EXP)/results/report/versus.csv

# Live training curves (docs/methods.md, "Watching training"): TensorBoard over every run of an
# experiment folder (EXPERIMENT, or EXP; default here) at http://localhost:$(TB_PORT)
EXPERIMENT ?= $(EXP)
TB_PORT ?= 6006
tensorboard: install
	$(VENV)/bin/tensorboard --logdir $(EXPERIMENT)/results/runs --port $(TB_PORT)

# Delete the downloaded COCO zips (~38 GB) whose extraction finished; others are kept.
COCO_DIR ?= resources/coco
cleanup: install
	$(PY) -c 'from distinctcap.data.coco import remove_extracted_zips as r; print(*r("$(COCO_DIR)"))'

# Where the time went: per rule, the sum and max of wall and CPU seconds and the peak memory,
# from the benchmark file every job writes under benchmarks/ (also in the report).
times: install
	$(PY) -m distinctcap.report.times $(EXP)/benchmarks

# When each job ran and how busy the cores were (from the run's Snakemake log), the stretches
# with a core idle, and the picture in $(EXP)/results/report/timeline.png.
timeline: install
	$(PY) -m distinctcap.report.timeline $(EXP) --png $(EXP)/results/report/timeline.png

# Retrain the shapes CLIP of config.yaml from scratch (presets/retrain-clip.yaml: ignore the
# shipped weights; ~26 min on 2 cores) and ship it in assets/clip/ with its sha256 and training
# fingerprint; commit both files. Needed only when the default's CLIP settings or world change.
ship-clip: install
	$(VENV)/bin/snakemake results/clip/shapes-rn-tiny.pt --cores $(CORES) --directory experiments/ship-clip --configfile presets/retrain-clip.yaml
	$(PY) -m distinctcap.clip.assets experiments/ship-clip/results/clip assets/clip

# The judge CLIP (evaluate.judge, docs/report.md "The judge CLIP"), the same way
ship-judge: install
	$(VENV)/bin/snakemake results/judge/shapes-rn-judge.pt --cores $(CORES) --directory experiments/ship-judge --configfile presets/retrain-judge.yaml
	$(PY) -m distinctcap.clip.assets experiments/ship-judge/results/judge assets/clip

# A GPU node without a package index (docs/gpus-and-slurm.md, "GPU check"): the wheels its
# image lacks (bench/gpu/carried.txt) for its Python, in .whl/; copy or carry .whl
# and bench/gpu_check.sh installs them there with pip --no-index --target.
GPU_PYTHON ?= 3.12
gpu-wheels: install
	bash bench/gpu/wheels.sh --python-version $(GPU_PYTHON) --dest .whl --python $(PY)

# That node rehearsed here: a clean venv of the GPU image's packages only, the wheels installed
# as there, then bench/gpu_check.sh --cpu (every part must end with a number).
gpu-rehearsal:
	bash bench/gpu/rehearsal.sh
