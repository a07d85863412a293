"""Which pods hold units of the daemon's resources, from the kubelet's PodResources API.

* ``lister``: one List call, answered as bytes.
* ``answer``: the answer's wire format walked for what is ours: the device plugin's units
  and the DRA driver's claimed devices, per container, in bounded memory.
* ``watch``: the component: when to list, the series, and the pods of a device that went.
"""
