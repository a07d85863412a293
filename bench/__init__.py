"""Benchmarks of ate-devplugin against Go device plugins, through the kubelet's device manager.

Run from the repository root with ``python -m bench run [--quick]``; see bench/README.md.
The suite drives the same test kit as the tests (``tests.harness``).
"""
