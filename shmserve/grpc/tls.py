"""TLS for the gRPC endpoint, with Triton's flags: --grpc-use-ssl with --grpc-server-cert and
--grpc-server-key (PEM files), and --grpc-use-ssl-mutual, which also asks every client for a
certificate signed by --grpc-root-cert. gRPC clients insist on HTTP/2 chosen by ALPN."""

import ssl
from dataclasses import dataclass


class TlsConfigError(ValueError):
    """The TLS flags or files cannot make a server context; the message says which."""


@dataclass(frozen=True)
class TlsSettings:
    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False


def settings_from_flags(use_ssl: bool, mutual: bool, server_cert, server_key,
                        root_cert) -> TlsSettings | None:
    """None without --grpc-use-ssl or --grpc-use-ssl-mutual (which implies it, as in Triton)."""
    if not (use_ssl or mutual):
        return None
    if not server_cert or not server_key:
        raise TlsConfigError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if mutual and not root_cert:
        raise TlsConfigError("--grpc-use-ssl-mutual needs --grpc-root-cert, which signs the "
                             "clients' certificates")
    return TlsSettings(server_cert, server_key, root_cert or "", mutual)


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # HTTP/2 forbids older ones
    try:
        context.load_cert_chain(settings.server_cert, settings.server_key)
        if settings.root_cert:
            context.load_verify_locations(settings.root_cert)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load the gRPC TLS certificates: {exc}") from None
    if settings.mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    return context
