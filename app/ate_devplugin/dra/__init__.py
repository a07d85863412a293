"""The DRA kubelet plugin: registration, the node service, this node's ResourceSlices and
the API server client. Imported only in mode dra or both: device-plugin mode loads none
of it (nor lightkube)."""
