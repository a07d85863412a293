"""KVM health in the daemon: the component that owns each probed resource's KVM state
(health.py), when each is probed (monitor.py), who probes (probes.py: the daemon itself or
nobody; link.py: the prober pod), and the NFD feature file that renders the state (labels.py)
(docs/kvm-health.md)."""
