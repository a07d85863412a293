"""KVM health in the daemon: when each resource with ``health: kvm`` is probed, and its verdict
handed to whoever advertises the resource (docs/kvm-health.md)."""
