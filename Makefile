# The two commands the README starts with: `make demo` and `make test`.
PYTHON ?= python3

.PHONY: demo test lint unit setup-demo setup-test proto bench

demo: setup-demo
	$(PYTHON) -m tools.demo

test: setup-test lint
	KUBELET_BENCH_REQUIRED=1 CHART_TOOLS_REQUIRED=1 IMAGE_TOOLS_REQUIRED=1 $(PYTHON) -m pytest -p no:cacheprovider

lint:
	ruff check .
	ruff format --check .
	mypy

unit:
	$(PYTHON) -m pytest tests/unit -q

setup-demo:
	tools/setup.sh demo

setup-test:
	tools/setup.sh test

proto:
	tools/gen-proto.sh

bench: setup-demo
	$(PYTHON) -m bench run
