"""Test harnesses shared by the test suites (real peers: kubelet device manager, Prometheus, ...).

Each module stands alone; import what you need, e.g. ``from tests.harness.kubelet import
KubeletBench, Namespace``.
"""
