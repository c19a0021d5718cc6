# npufix developer tasks. Everything installs into a local venv (.venv) from pyproject.toml.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test lint fixtures fuzz bench clean

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

## make test: install, then run the test suite (the CI profile; vendor toolchains and slow tests excluded)
test: install
	$(PY) -m pytest -q -m "not vendor and not slow"

lint: install
	$(VENV)/bin/ruff check onnx_npu_fix tests fixtures bench examples

fixtures: install
	$(PY) fixtures/build_fixtures.py

fuzz: install
	NPUFIX_FUZZ_EXAMPLES=3000 $(PY) -m pytest -q tests/test_fuzz.py

bench: install
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) bench/bench.py

clean:
	rm -rf build $(VENV) .pytest_cache
