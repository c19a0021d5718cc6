# npufix developer tasks. Everything installs into a local venv (.venv) from pyproject.toml.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
STAMP_DOCS := $(VENV)/.installed-docs
# The minimum-pins environment: every dependency at the floor pyproject.toml declares (.ci/min_requirements.py).
VENV_MIN  ?= .venv-min
STAMP_MIN := $(VENV_MIN)/.installed

.PHONY: install run test test-min lint docs fixtures fuzz bench bench-install bench-check bench-asv clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## make run: install, then fix the bundled ConvTasNet-like fixture and print the summary
run: install
	mkdir -p build
	$(VENV)/bin/npufix fixtures/tcn.onnx -o build/tcn_fixed.onnx --max-dilation 4 --align 8 \
		--report build/tcn_report.json

## make test: install, then run the test suite on TEST_WORKERS processes (pytest-xdist; the CI profile: vendor
## toolchains excluded). Each file's tests stay in one worker, so a module's shared fixtures are built once.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not vendor"

## make test-min: the test suite with every dependency at its declared floor (keeps the floors in pyproject true);
## in one process: pytest 7.0 with xdist's workers logs KeyboardInterrupt warnings at shutdown
test-min: $(STAMP_MIN)
	$(VENV_MIN)/bin/python -m pytest -q -p no:cacheprovider -m "not vendor"

$(STAMP_MIN): pyproject.toml .ci/min_requirements.py
	$(PYTHON) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/python -m pip install --quiet --upgrade pip
	$(PYTHON) .ci/min_requirements.py > $(VENV_MIN)/requirements-min.txt
	$(VENV_MIN)/bin/python -m pip install --quiet --only-binary :all: -r $(VENV_MIN)/requirements-min.txt
	$(VENV_MIN)/bin/python -m pip install --quiet --no-deps -e .
	touch $(STAMP_MIN)

lint: install
	$(VENV)/bin/ruff check onnx_npu_fix tests fixtures bench benchmarks examples docs

## make docs: the manual (docs/, mkdocs.yml) built strictly into build/site: a broken link or anchor fails. The CLI
## reference page is generated from the click definitions by docs/hooks.py, so the installed package must be this one.
docs: $(STAMP_DOCS)
	$(VENV)/bin/mkdocs build --strict --quiet

$(STAMP_DOCS): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(STAMP_DOCS)

fixtures: install
	$(PY) fixtures/build_fixtures.py

fuzz: install
	NPUFIX_FUZZ_EXAMPLES=3000 $(PY) -m pytest -q tests/test_fuzz.py

bench: bench-install
	$(PY) bench/bench.py

STAMP_BENCH := $(VENV)/.installed-bench
bench-install: $(STAMP_BENCH)

$(STAMP_BENCH): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP_BENCH)

## make bench-check: the asv suite (benchmarks/) still imports and its benchmarks are well formed; runs nothing,
## builds no environment (CI)
bench-check: bench-install
	$(VENV)/bin/asv check --environment existing:$(PY)

## make bench-asv: the asv suite on this checkout's HEAD in its own virtualenv (docs/benchmark.md: compare, publish)
bench-asv: bench-install
	$(VENV)/bin/asv machine --yes
	$(VENV)/bin/asv run HEAD^!

clean:
	rm -rf build $(VENV) $(VENV_MIN) .pytest_cache
