"""KVM itself: a functional probe of a KVM device, the guest program it runs, and the node's
virtualisation facts. Standard library only, so that the probe's child process starts
without loading the daemon (docs/kvm-health.md)."""
