"""The host, as the daemon meets it: device nodes, CDI spec files, filesystem events and
unix-socket gRPC servers. Nothing here knows the kubelet's APIs."""
