"""A secured daemon from Python: a tenant's token or certificate lets it at
its own blocks only, and no credentials get Unauthenticated."""

import os
import subprocess

import numpy as np
import pytest

from kvpool import PermissionDenied, Unauthenticated
from kvpool.client import Client
from kvpool.daemon import Daemon


@pytest.fixture(scope="module")
def secured(kvpool_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    subprocess.run([kvpool_bin, "auth", "certs", "--dir", str(d), "--node", "py-secure", "--tenant", "acme,globex"], check=True,
                   capture_output=True)
    tokens = {}
    for name, tenant in (("acme-py", "acme"), ("globex-py", "globex")):
        out = subprocess.run([kvpool_bin, "auth", "token", "--name", name, "--tenant", tenant, "--file", str(d / "tokens")],
                             check=True, capture_output=True, text=True)
        tokens[tenant] = out.stdout.strip()
    node = Daemon.start("py-secure", tmp_path_factory.mktemp("node"), capacity="64MiB", standalone=True, binary=kvpool_bin, extra=[
        "--tls-cert", str(d / "node-py-secure.pem"), "--tls-key", str(d / "node-py-secure-key.pem"),
        "--client-ca", str(d / "ca.pem"), "--token-file", str(d / "tokens")])
    yield node, d, tokens
    assert node.stop() == 0, node.log()[-4000:]


@pytest.mark.parametrize("path", ["data", "grpc", "shm"])
def test_a_tenant_token_reaches_its_own_blocks_only(secured, path):
    node, _, tokens = secured
    value = np.arange(50_000, dtype=np.uint8)
    with Client(node.addr, tenant="acme", namespace=f"t-{path}", path=path, token=tokens["acme"]) as acme:
        acme.put(b"k", value)
        assert bytes(acme.get(b"k")) == value.tobytes()
        if path == "shm":
            return  # same-host sessions are the node's own user's: trusted with the arena
        with pytest.raises(PermissionDenied):
            acme.scoped(tenant="globex").get(b"k")
        with pytest.raises(PermissionDenied):
            acme.scoped(tenant="globex").put(b"k2", value)


def test_no_credentials_are_unauthenticated(secured):
    node, _, _ = secured
    env = os.environ.pop("KVPOOL_TOKEN", None)
    try:
        with pytest.raises(Unauthenticated):
            Client(node.addr, tenant="acme", path="grpc")
    finally:
        if env is not None:
            os.environ["KVPOOL_TOKEN"] = env


@pytest.mark.parametrize("path", ["data", "grpc"])
def test_a_client_certificate_over_tls(secured, path):
    node, d, _ = secured
    value = np.arange(3 << 20, dtype=np.uint8)  # several TLS records
    with Client(node.addr, tenant="globex", namespace=f"tls-{path}", path=path, tls_ca=str(d / "ca.pem"),
                tls_cert=str(d / "tenant-globex.pem"), tls_key=str(d / "tenant-globex-key.pem")) as c:
        assert c.path == path
        c.put(b"k", value)
        assert bytes(c.get(b"k")) == value.tobytes()
        with pytest.raises(PermissionDenied):
            c.scoped(tenant="acme").get(b"k")
        with pytest.raises(PermissionDenied):
            c.scoped(tenant="acme").exists([b"k"])
