# Two entry points for a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test validate validate-models bench figures clean docs-latex docs-site

$(BIN)/sigprop: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.test-deps: $(BIN)/sigprop
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

run: $(BIN)/sigprop
	$(BIN)/sigprop predict --arch preln --layers 768

test: $(VENV)/.test-deps
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

# Full published-grid sweeps for every component; rewrites docs/validation.md.
validate: $(VENV)/.test-deps
	$(BIN)/python -m sigprop.mc.validate --out docs/validation.md

# Whole-model accuracy floor (sigprop check over archs x inits x depths x dropout x causal);
# results in docs/validation/floor/, table in docs/validation.md.  Hours on 2 cores (on a Dask
# cluster: python -m sigprop.mc.floor --docs --dask ADDRESS, or --dask local --workers N).
validate-models: $(VENV)/.test-deps
	$(BIN)/python -m sigprop.mc.floor --docs
	$(BIN)/python -m sigprop.mc.validate --out docs/validation.md --assemble

bench: $(BIN)/sigprop
	$(BIN)/python benchmarks/run.py
	$(BIN)/python benchmarks/check_speed.py

$(VENV)/.plot-deps: $(BIN)/sigprop
	$(BIN)/python -m pip install -q -e '.[plot]'
	touch $@

# The README's figure (docs/figures/depth.png): prediction lines and Monte Carlo markers for
# five architectures at 192 layers; the Monte Carlo takes several minutes.
FIGURE_MODEL := --arch preln,postln,dslm,deepnorm,lns --layers 192 --d-model 256 --heads 4 --d-ff 1024 --seq-len 128
FIGURE_MC    := --check --trials 2 --batch 2 --seed 0 --mark-every 16

figures: $(VENV)/.plot-deps
	mkdir -p docs/figures
	$(BIN)/sigprop plot $(FIGURE_MODEL) $(FIGURE_MC) -o docs/figures/depth.png

# The rendered component table in docs/ (docs/latex/): `sigprop export latex`, pdflatex and
# pdftoppm (Debian: texlive-latex-base texlive-latex-recommended poppler-utils).
docs-latex: $(BIN)/sigprop
	mkdir -p docs/latex
	$(BIN)/sigprop export latex --what components -o docs/latex/components.tex
	cd docs/latex && pdflatex -interaction=nonstopmode -halt-on-error components.tex > /dev/null
	for p in 1 2; do pdftoppm -png -r 100 -f $$p -l $$p -singlefile docs/latex/components.pdf docs/latex/components-table-$$p; done
	rm -f docs/latex/components.aux docs/latex/components.log

$(VENV)/.docs-deps: $(BIN)/sigprop
	$(BIN)/python -m pip install -q -e '.[docs]'
	touch $@

# The documentation site from docs/ (mkdocs.yml): built with --strict, so a broken link or
# anchor, or a page missing from the navigation, fails; the pages are written to site/.
docs-site: $(VENV)/.docs-deps
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis site
