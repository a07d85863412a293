"""A real OCI registry inside a cluster's sandbox, serving under the name the documentation uses.

Debian's ``docker-registry`` (the distribution registry, which also stores Helm charts as
OCI artifacts) serves HTTPS on port 443 with a certificate of its own CA for :data:`HOST`
(``ghcr.io``, the project's published registry) and its address. The API server holds
port 443 on every address of the sandbox, so the registry runs in mount and network
namespaces of its own on the nodes' bridge, at :data:`ADDRESS`, where the sandbox and
every node reach it. The commands the documentation prints then run as they are: helm
finds the chart at ``oci://ghcr.io/ate-dev/charts/ate-devplugin`` and every node's
containerd pulls the image the chart names by default. Nothing outside the sandbox sees
either name or certificate:

* ``HOST`` resolves to the address in the sandbox and on every node: a line of the
  cluster's ``/etc/hosts`` (:meth:`Cluster.set_host`), bind-mounted in each of their mount
  namespaces;
* every node's containerd pulls from ``https://ghcr.io`` and trusts the CA through
  ``ghcr.io/hosts.toml`` in the cluster's registry ``config_path``
  (:attr:`Cluster.registry_config_dir`), as a user's node would name a registry;
* helm and buildah (Go programs) trust the CA through ``SSL_CERT_FILE``
  (:meth:`Registry.client_env`);
* :meth:`Registry.run_outside` runs a command with the host's mounts (its image storage,
  the checkout) but the sandbox's network and a private ``/etc/hosts``: how
  tools/release.sh pushes the image built on the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.clusters import required
from tests.e2e.sandbox import NodeNamespaces, Process, SandboxError

HOST = "ghcr.io"
ADDRESS = "10.88.0.2"  # on the nodes' bridge (tests/e2e/cluster.py), below the nodes' addresses
INSTALL = "apt-get install -y docker-registry"
VETH = "e2e-veth-reg"  # its end on the nodes' bridge


@contextlib.contextmanager
def serving(cluster: Cluster, workdir: Path) -> Iterator[Registry]:
    """A :class:`Registry` of ``cluster`` under ``workdir``, started, and stopped after. Without
    docker-registry the test is skipped (failed under ``CI=true`` or ``E2E_REQUIRED=1``)."""
    if shutil.which("docker-registry") is None:
        why = f"no docker-registry: {INSTALL} (or tools/setup.sh test)"
        if required():
            pytest.fail(f"{why} (CI=true or E2E_REQUIRED=1)")
        pytest.skip(why)
    registry = Registry(cluster, workdir)
    try:
        registry.start()
        yield registry
    finally:
        registry.stop()


class Registry:
    """The registry process, its namespaces, its CA and data under ``workdir``; :meth:`start`,
    :meth:`stop`."""

    def __init__(self, cluster: Cluster, workdir: Path, host: str = HOST, address: str = ADDRESS) -> None:
        self.cluster = cluster
        self.sandbox = cluster.sandbox
        self.dir = workdir
        self.host = host
        self.address = address
        self.ca = workdir / "ca.crt"
        self.hosts_toml = cluster.registry_config_dir / host / "hosts.toml"
        self.ns: NodeNamespaces | None = None
        self.process: Process | None = None
        self.named = False

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._certificates()
        config = self.dir / "config.yml"
        settings = {
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "data")}, "delete": {"enabled": True}},
            "http": {"addr": f"{self.address}:443", "tls": {"certificate": str(self.dir / "tls.crt"),
                                                           "key": str(self.dir / "tls.key")}},
        }  # fmt: skip
        config.write_text(json.dumps(settings))  # YAML is a superset of JSON
        self.ns = self.sandbox.node("registry")
        self.cluster.attach(self.ns, VETH, self.address)
        self.cluster.set_host(self.host, self.address)
        self.named = True
        self.process = self.ns.spawn("docker-registry", ["docker-registry", "serve", str(config)])
        deadline = time.monotonic() + 60
        while self.sandbox.run(self.curl(f"https://{self.host}/v2/"), check=False).returncode != 0:
            if not self.process.running() or time.monotonic() > deadline:
                raise SandboxError(f"the registry did not answer: {self.process.log_tail()}")
            time.sleep(0.3)
        self._configure_containerd()

    def stop(self) -> None:
        """Everything :meth:`start` made, in reverse: containerd's entry, the process, the
        name, the namespaces (their veth goes with them)."""
        if self.hosts_toml.exists():
            self.hosts_toml.unlink()
            self.hosts_toml.parent.rmdir()
        if self.process is not None:
            self.process.stop()
            self.sandbox.processes.remove(self.process)
            self.process = None
        if self.named:
            self.cluster.set_host(self.host, None)
            self.named = False
        if self.ns is not None:
            # Deleted here, not left to the namespace's end (the kernel frees a network
            # namespace later): the next registry of the cluster takes the same name.
            self.sandbox.run(["ip", "link", "del", VETH], check=False)
            self.ns.close()
            self.ns = None

    def _certificates(self) -> None:
        """A CA of its own (EC P-256) and a serving certificate for the host and its address."""

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=self.dir, check=True, capture_output=True, timeout=60)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                "-subj", "/CN=ate-e2e-registry-ca")  # fmt: skip
        (self.dir / "tls.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            f"subjectAltName=DNS:{self.host},IP:{self.address}\n"
        )
        openssl("req", "-new", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={self.host}")
        openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-sha256", "-extfile", "tls.ext", "-out", "tls.crt")  # fmt: skip

    def _configure_containerd(self) -> None:
        """``<host>/hosts.toml`` in every node's ``config_path``: pulls of ``HOST`` go to it by
        name (each node resolves it) and trust its CA. The CRI plugin reads it on every pull,
        so no containerd needs a restart."""
        self.hosts_toml.parent.mkdir(parents=True, exist_ok=True)
        self.hosts_toml.write_text(
            f'server = "https://{self.host}"\n\n'
            f'[host."https://{self.host}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
            f'  ca = "{self.ca}"\n'
        )

    # --- clients --------------------------------------------------------------------------

    def curl(self, url: str, *args: str) -> list[str]:
        return ["curl", "-sSf", "--cacert", str(self.ca), *args, url]

    def client_env(self) -> dict[str, str]:
        """What Go clients (helm, buildah) need to trust the registry: its CA as their roots."""
        return {"SSL_CERT_FILE": str(self.ca)}

    def manifest_digest(self, repository: str, reference: str) -> str:
        """The digest the registry serves for ``repository:reference`` (an image manifest)."""
        accept = "application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json"
        url = f"https://{self.host}/v2/{repository}/manifests/{reference}"
        head = self.sandbox.run(self.curl(url, "-I", "-H", f"Accept: {accept}")).stdout
        for line in head.splitlines():
            name, _, value = line.partition(":")
            if name.strip().lower() == "docker-content-digest":
                return value.strip()
        raise SandboxError(f"no Docker-Content-Digest for {repository}:{reference}:\n{head}")

    def tags(self, repository: str) -> list[str]:
        out = self.sandbox.run(self.curl(f"https://{self.host}/v2/{repository}/tags/list")).stdout
        tags: list[str] = json.loads(out).get("tags") or []
        return tags

    def run_outside(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` with the host's mounts, the sandbox's network namespace and a private
        mount namespace whose /etc/hosts names the registry (the host's is not touched)."""
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        out = subprocess.run(
            ["nsenter", "-t", str(self.sandbox.init_pid), "-n", "--",
             "unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(self.cluster.hosts_file),
             *argv],
            capture_output=True, text=True, timeout=timeout, check=False,
            env={**os.environ, **self.client_env(), **(env or {})},
        )  # fmt: skip
        if out.returncode != 0:
            raise SandboxError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr[-4000:]}\n{out.stdout[-2000:]}")
        return out
