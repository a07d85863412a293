"""A real OCI registry inside the sandbox, serving under the name the documentation uses.

Debian's ``docker-registry`` (the distribution registry, which also stores Helm charts as
OCI artifacts) runs in the sandbox's namespaces and serves HTTPS on port 443 with a
certificate of its own CA for :data:`HOST` (``ghcr.io``, the project's published
registry). In the sandbox's mount namespace ``/etc/hosts`` gets ``HOST`` pointing at the
registry, so the commands the documentation prints run there as they are: helm finds the
chart at ``oci://ghcr.io/ate-dev/charts/ate-devplugin`` and containerd pulls the image the
chart names by default. Nothing outside the sandbox sees either name or certificate:

* containerd trusts the CA through ``hosts.toml`` in its ``config_path`` directory
  (:meth:`Registry.configure_containerd`);
* helm, buildah (Go programs) trust it through ``SSL_CERT_FILE`` (:meth:`Registry.client_env`);
* :meth:`Registry.run_outside` runs a command with the host's mounts (its image storage,
  the checkout) but the sandbox's network and a private ``/etc/hosts``: how
  tools/release.sh pushes the image built on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.e2e.sandbox import Process, Sandbox, SandboxError

HOST = "ghcr.io"
ADDRESS = "127.0.0.1"  # in the sandbox's network namespace, where containerd and helm run
INSTALL = "apt-get install -y docker-registry"


class Registry:
    """The registry process, its CA and data under ``workdir``; :meth:`start`, :meth:`stop`."""

    def __init__(self, sandbox: Sandbox, workdir: Path, host: str = HOST, address: str = ADDRESS) -> None:
        self.sandbox = sandbox
        self.dir = workdir
        self.host = host
        self.address = address
        self.ca = workdir / "ca.crt"
        self.hosts_file = workdir / "hosts"
        self.process: Process | None = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._certificates()
        config = self.dir / "config.yml"
        settings = {
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "data")}, "delete": {"enabled": True}},
            "http": {"addr": "0.0.0.0:443", "tls": {"certificate": str(self.dir / "tls.crt"),
                                                    "key": str(self.dir / "tls.key")}},
        }  # fmt: skip
        config.write_text(json.dumps(settings))  # YAML is a superset of JSON
        original = self.sandbox.run(["cat", "/etc/hosts"]).stdout
        self.hosts_file.write_text(f"{original.rstrip()}\n{self.address} {self.host}\n")
        self.sandbox.run(["mount", "--bind", str(self.hosts_file), "/etc/hosts"])
        self.process = self.sandbox.spawn("docker-registry", ["docker-registry", "serve", str(config)])
        deadline = time.monotonic() + 60
        while self.sandbox.run(self.curl(f"https://{self.host}/v2/"), check=False).returncode != 0:
            if not self.process.running() or time.monotonic() > deadline:
                raise SandboxError(f"the registry did not answer: {self.process.log_tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.sandbox.processes.remove(self.process)
            self.process = None
            self.sandbox.run(["umount", "/etc/hosts"], check=False)

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

    # --- clients --------------------------------------------------------------------------

    def curl(self, url: str, *args: str) -> list[str]:
        return ["curl", "-sSf", "--cacert", str(self.ca), *args, url]

    def client_env(self) -> dict[str, str]:
        """What Go clients (helm, buildah) need to trust the registry: its CA as their roots."""
        return {"SSL_CERT_FILE": str(self.ca)}

    def configure_containerd(self, config_path: Path) -> None:
        """The registry in containerd's ``config_path`` directory (``<host>/hosts.toml``): the
        CRI plugin reads it on every pull, so a running containerd needs no restart."""
        host_dir = config_path / self.host
        host_dir.mkdir(parents=True, exist_ok=True)
        (host_dir / "hosts.toml").write_text(
            f'server = "https://{self.host}"\n\n'
            f'[host."https://{self.host}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
            f'  ca = "{self.ca}"\n'
        )

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
             "unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(self.hosts_file), *argv],
            capture_output=True, text=True, timeout=timeout, check=False,
            env={**os.environ, **self.client_env(), **(env or {})},
        )  # fmt: skip
        if out.returncode != 0:
            raise SandboxError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr[-4000:]}\n{out.stdout[-2000:]}")
        return out
