"""KVM itself: a functional probe of a KVM device, the guest program it runs, the node's
virtualisation facts, and the two commands that run a probe where the device was granted:
``verify`` and the prober (with its protocol, wire.py). Standard library only (and the
package's own tasks.py), so that the probe's child process and the prober start without
loading the daemon (docs/kvm-health.md)."""
