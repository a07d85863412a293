"""The kubelet device plugin API: one agent per resource (the reconciler decides, the
agent acts), its servicer and socket, registration, and which pods hold units
(PodResources)."""
