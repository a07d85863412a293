"""The test kit: what tests, bench/ and tools/ share, imported as ``tests.harness``.

Written once each: :mod:`.wait` (wait_until, holds_for), :mod:`.net` (free_port,
http_get), :mod:`.process` (stop_process), :mod:`.devices` (device roots, mknod,
can_mknod), :mod:`.require` (skip locally, fail under CI), :mod:`.outcome` (logs of
failed tests), :mod:`.microvm` (a micro-VM on /dev/kvm through KVM_RUN). Real peers:
:mod:`.kubelet` (namespace, the kubelet's device manager, the Go stub plugin),
:mod:`.daemon` (our daemon as a process), :mod:`.prometheus`, :mod:`.otlp`; scenarios on
top: :mod:`.monitoring`, :mod:`.faults`, :mod:`.chart`, :mod:`.image`.

Each module stands alone; import what you need, e.g. ``from tests.harness.kubelet import
KubeletBench, Namespace``.
"""
