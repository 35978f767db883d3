"""gRPC over TLS with Triton's flags (--grpc-use-ssl, --grpc-use-ssl-mutual, --grpc-server-cert,
--grpc-server-key, --grpc-root-cert), through tritonclient's own TLS options, with certificates
from a throwaway CA (trustme)."""

import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, start_server, stop_server


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """PEM files: the CA, the server's certificate and key, and a client's."""
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    files = {"ca": folder / "ca.pem", "server_cert": folder / "server.pem",
             "server_key": folder / "server.key", "client_cert": folder / "client.pem",
             "client_key": folder / "client.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(files["server_cert"]))
    server.private_key_pem.write_to_path(str(files["server_key"]))
    client = ca.issue_cert("client@example.com")
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return {name: str(path) for name, path in files.items()}


def serve(test_repository, tmp_path, pki, *flags):
    return start_server(test_repository, str(tmp_path / "s.log"),
                        "--model-control-mode=explicit", "--load-model=identity_fp32",
                        f"--grpc-server-cert={pki['server_cert']}",
                        f"--grpc-server-key={pki['server_key']}", *flags,
                        wait_models=("identity_fp32",))


def echo(client) -> list:
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
    return client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").tolist()


def test_tls(test_repository, tmp_path, pki):
    server = serve(test_repository, tmp_path, pki, "--grpc-use-ssl=true")
    try:
        with grpcclient.InferenceServerClient(server.grpc_url, ssl=True,
                                              root_certificates=pki["ca"]) as client:
            assert client.is_server_live()
            assert echo(client) == [[1, 2, 3]]
        # A client speaking plaintext gets no answer, only a closed connection.
        with grpcclient.InferenceServerClient(server.grpc_url) as plain:
            with pytest.raises(InferenceServerException) as refused:
                plain.is_server_live(client_timeout=5)
        assert refused.value.status() in ("StatusCode.UNAVAILABLE",
                                          "StatusCode.DEADLINE_EXCEEDED")
    finally:
        stop_server(server)


def test_mutual_tls_needs_a_client_certificate(test_repository, tmp_path, pki):
    server = serve(test_repository, tmp_path, pki, "--grpc-use-ssl-mutual=true",
                   f"--grpc-root-cert={pki['ca']}")
    try:
        with grpcclient.InferenceServerClient(
                server.grpc_url, ssl=True, root_certificates=pki["ca"],
                private_key=pki["client_key"], certificate_chain=pki["client_cert"]) as client:
            assert echo(client) == [[1, 2, 3]]
        with grpcclient.InferenceServerClient(server.grpc_url, ssl=True,
                                              root_certificates=pki["ca"]) as anonymous:
            with pytest.raises(InferenceServerException) as refused:
                anonymous.is_server_live(client_timeout=5)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        # The HTTP endpoint is unaffected (Triton has no TLS there either).
        with httpclient.InferenceServerClient(server.http_url) as http:
            assert http.is_server_live()
    finally:
        stop_server(server)


@pytest.mark.parametrize("flags,message", [
    (["--grpc-use-ssl=true"], "needs --grpc-server-cert and --grpc-server-key"),
    (["--grpc-use-ssl-mutual=true", "--grpc-server-cert=x", "--grpc-server-key=y"],
     "needs --grpc-root-cert"),
    (["--grpc-use-ssl=true", "--grpc-server-cert=/no/such.pem", "--grpc-server-key=/no/such.key"],
     "cannot load the gRPC TLS certificates"),
])
def test_bad_tls_flags_stop_the_server_with_a_reason(flags, message):
    done = subprocess.run([sys.executable, "-m", "shmserve.cli", "--model-repository", ROOT,
                           *flags], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert message in done.stderr
