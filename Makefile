# The two commands the README starts with: `make demo` and `make test`.
PYTHON ?= python3

.PHONY: demo test e2e lint unit setup-demo setup-test proto bench

demo: setup-demo
	$(PYTHON) tools/demo.py

test: setup-test lint
	KUBELET_BENCH_REQUIRED=1 CHART_TOOLS_REQUIRED=1 IMAGE_TOOLS_REQUIRED=1 $(PYTHON) -m pytest -p no:cacheprovider

# The user's path on a real one-node cluster (tests/e2e): root, /dev/kvm and Debian's
# containerd, runc, etcd and CNI plugins. `make test` runs it too where the machine
# allows (and always under CI=true); this runs only it, and fails instead of skipping.
e2e: setup-test
	E2E_REQUIRED=1 IMAGE_TOOLS_REQUIRED=1 $(PYTHON) -m pytest -p no:cacheprovider tests/e2e

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
