"""TLS: a real server with a self-signed certificate, reached by the client and the CLI over TLS;
a plaintext client, or one trusting another CA, is refused."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from actstore.client import Client
from actstore.errors import InvalidArgument, Unavailable
from actstore.server.app import start_server
from tests.conftest import make_settings

REPO = Path(__file__).resolve().parents[2]


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost / 127.0.0.1 signed by its own key: (cert.pem, key.pem)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def tls_files(tmp_path):
    return self_signed(tmp_path / "tls")


@pytest.fixture
def tls_server(tmp_path, ray_cluster, tls_files):
    cert, key = tls_files
    running = start_server(make_settings(tmp_path / "store", tls_cert=cert, tls_key=key))
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def _no_ambient_tls(monkeypatch):
    monkeypatch.delenv("ACTSTORE_TLS_CA", raising=False)
    monkeypatch.delenv("ACTSTORE_TOKEN", raising=False)


def test_client_over_tls_works_and_plaintext_is_refused(tls_server, tls_files):
    address = f"127.0.0.1:{tls_server.port}"
    with Client(address, root_certificates=tls_files[0].read_bytes()) as c:
        dataset = c.register_dataset(texts=["the cat sat", "a dog ran"], name="pets")
        assert [d.digest for d in c.datasets()] == [dataset.digest]
    with Client(address) as plain, pytest.raises(Unavailable):
        plain.datasets()


def test_a_certificate_from_another_ca_is_not_trusted(tls_server, tmp_path):
    other_ca, _ = self_signed(tmp_path / "other")
    with Client(f"127.0.0.1:{tls_server.port}", root_certificates=other_ca.read_bytes()) as c, \
            pytest.raises(Unavailable):
        c.datasets()


def test_the_ca_can_come_from_the_environment(tls_server, tls_files, monkeypatch):
    monkeypatch.setenv("ACTSTORE_TLS_CA", str(tls_files[0]))
    with Client(f"127.0.0.1:{tls_server.port}") as c:
        assert c.datasets() == []


def test_cli_over_tls(tls_server, tls_files, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTSTORE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    address = f"127.0.0.1:{tls_server.port}"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "actstore.cli", *args], check=False, capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=120)

    with Client(address, root_certificates=tls_files[0].read_bytes()) as c:
        c.register_dataset(texts=["the cat sat", "a dog ran"], name="tls-pets")
    listed = cli("datasets", "--address", address, "--tls-ca", str(tls_files[0]))
    assert listed.returncode == 0, listed.stderr
    assert "tls-pets" in listed.stdout
    refused = cli("datasets", "--address", address)
    assert refused.returncode != 0 and "UNAVAILABLE" in refused.stderr, refused.stderr


def test_half_a_tls_configuration_is_refused(tmp_path, tls_files):
    with pytest.raises(InvalidArgument, match="both tls_cert and tls_key"):
        start_server(make_settings(tmp_path / "store", tls_cert=tls_files[0]))
