# The two commands the README starts with: `make demo` and `make test`.
PYTHON ?= python3
# Branch-coverage floors, in percent of app/ate_devplugin (generated api/ aside): the whole
# suite with the daemons it starts (test), and the unit tests alone, unprivileged (unit-nonroot).
COVERAGE_FLOOR ?= 95
UNIT_COVERAGE_FLOOR ?= 85
# unit-nonroot runs as nobody, who can read neither an interpreter under /root (pyenv) nor
# perhaps this checkout: it gets a venv of Debian's python3 and a copy of the sources in /tmp.
NONROOT_VENV ?= /tmp/ate-devplugin-nonroot-venv

.PHONY: demo test e2e lint unit unit-nonroot setup-demo setup-bench setup-test proto generate bench bench-docs dashboards-png

demo: setup-demo
	$(PYTHON) -m tools.demo

# Missing tools skip their tests locally; CI=true (.ci/run) makes them fail (tests/harness/require.py).
test: setup-test lint unit-nonroot
	PYTHON=$(PYTHON) COVERAGE_FLOOR=$(COVERAGE_FLOOR) tools/run-tests.sh

# The user's path on real clusters (tests/e2e): root, /dev/kvm and Debian's containerd,
# runc, etcd, CNI plugins and docker-registry. `make test` runs it too where the machine
# allows (and always under CI=true); this runs only it, and fails instead of skipping.
e2e: setup-test
	E2E_REQUIRED=1 $(PYTHON) -m pytest -p no:cacheprovider tests/e2e

lint:
	ruff check .
	ruff format --check .
	mypy

unit:
	$(PYTHON) -m pytest tests/unit -q

# The unit tests as an unprivileged user (nobody), on a copy of the sources with a private
# HOME and tmp (a short --basetemp: the tests' unix socket paths must stay under 108 bytes).
# CI is unset there: what needs root (one real-mknod test) is skipped, and run
# by `make test` as root.
unit-nonroot: $(NONROOT_VENV)/.installed
	tmp=$$(mktemp -d) && chmod 755 "$$tmp" && \
	git ls-files -z app bench dashboards proto tests tools docs pyproject.toml | xargs -0 cp --parents -t "$$tmp" && \
	chown -R 65534:65534 "$$tmp" && cd "$$tmp" && \
	setpriv --reuid=65534 --regid=65534 --clear-groups \
		env -u CI HOME="$$tmp" TMPDIR="$$tmp" PYTHONPATH="$$tmp/app" PATH="$(NONROOT_VENV)/bin:$$PATH" \
		COVERAGE_FILE="$$tmp/.coverage" HYPOTHESIS_STORAGE_DIRECTORY="$$tmp/hypothesis" PYTHONDONTWRITEBYTECODE=1 \
		$(NONROOT_VENV)/bin/python -m pytest tests/unit -q -p no:cacheprovider --basetemp="$$tmp/t" \
		--cov --cov-report=term --cov-fail-under=$(UNIT_COVERAGE_FLOOR); \
	rc=$$?; rm -rf "$$tmp"; exit $$rc

# The package itself comes from the copy (PYTHONPATH); the venv holds its dependencies.
$(NONROOT_VENV)/.installed: pyproject.toml
	/usr/bin/python3 -m venv $(NONROOT_VENV)
	$(NONROOT_VENV)/bin/pip install -q --upgrade pip
	$(NONROOT_VENV)/bin/pip install -q ".[dev]"
	chmod -R a+rX $(NONROOT_VENV)
	touch $@

setup-demo:
	tools/setup.sh demo

setup-bench:
	tools/setup.sh bench

setup-test:
	tools/setup.sh test

proto:
	tools/gen-proto.sh

# Every generated file, from its one source; each has a test that fails on drift
# (tests/unit/api, tests/chart/test_config_contract.py, tests/dashboards,
# tests/chart/test_chart_monitoring.py, tests/chart/test_chart_args.py,
# tests/unit/test_architecture.py, tests/docs).
# Dashboards before the chart's copy of them.
generate: proto
	$(PYTHON) tools/gen-config-schema.py
	$(PYTHON) dashboards/generate.py
	$(PYTHON) tools/sync-chart-files.py
	$(PYTHON) tools/gen-chart-args.py
	$(PYTHON) tools/gen-settings-doc.py
	$(PYTHON) tools/import-graph.py --doc docs/architecture.md
	$(PYTHON) -m bench.quotes

bench: setup-bench
	$(PYTHON) -m bench run

# The benchmark figures README.md, docs/ and bench/findings.md quote, and docs/benchmarks.md,
# rewritten from bench/results (tests/docs fails when they differ).
bench-docs:
	$(PYTHON) -m bench.quotes

# The dashboards' pictures in docs/ (docs/dashboards.md): as root, two daemons under the kubelet
# bench through a healthy spell and a lost device, drawn by the Perses panels in Chromium.
dashboards-png: setup-test
	$(PYTHON) -m tools.render_dashboards
