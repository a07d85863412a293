"""ate-devplugin: hands host character devices to pods through the kubelet device plugin API."""

__version__ = "0.1.0"
