"""Fetching image URLs from a real HTTP server on 127.0.0.1: bodies, statuses, redirects,
limits, timeouts, and the SSRF guard (address checks on every hop, the checked address
connected to, TLS verified against the URL's name)."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import io
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.images import ImageRef, load_images
from vllm_mlx.api.images.fetch import IPAddress, address_refusal, fetch_image
from vllm_mlx.config.images import ImageFetchSettings
from vllm_mlx.config.limits import LimitsSettings

FIELD = "messages[0].content[0].image_url.url"
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (6, 4), (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


PNG = png_bytes()
BIG = b"\x00" * 5000


@dataclass
class Server:
    port: int
    seen: list[tuple[str, str]] = field(default_factory=list)  # (path, Host header)
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def make_handler(server: Server) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            server.seen.append((self.path, self.headers.get("Host", "")))
            routes = {
                "/cat.png": lambda: self.send(200, PNG),
                "/missing": lambda: self.send(404, b"not here"),
                "/r1": lambda: self.redirect("/r2"),
                "/r2": lambda: self.redirect("/r3"),
                "/r3": lambda: self.redirect("/cat.png"),
                "/to-private": lambda: self.redirect("http://10.0.0.1/cat.png"),
                "/to-ftp": lambda: self.redirect("ftp://example.com/cat.png"),
                "/to-broken": lambda: self.redirect("http://[::1"),
                "/big": lambda: self.send(200, BIG),
                "/big-unsized": self.unsized,
                "/gzipped": lambda: self.send(200, PNG, {"Content-Encoding": "gzip"}),
                "/slow": self.slow,
            }
            routes.get(self.path, lambda: self.send(500, b"no such route"))()

        def send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def redirect(self, location: str) -> None:
            self.send(302, b"", {"Location": location})

        def unsized(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(BIG), 1000):
                self.wfile.write(b"%x\r\n%s\r\n" % (1000, BIG[start : start + 1000]))
            self.wfile.write(b"0\r\n\r\n")

        def slow(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.write(PNG[:10])
            self.wfile.flush()
            server.release.wait()  # the rest never comes while the client waits

    return Handler


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    state = Server(0)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()


def settings(**values: Any) -> ImageFetchSettings:
    return ImageFetchSettings(**{"allow_private_addresses": True, **values})


def fetch(url: str, fetch_settings: ImageFetchSettings, **hooks: Any) -> bytes:
    return asyncio.run(fetch_image(url, FIELD, fetch_settings, **hooks))


def refused(url: str, fetch_settings: ImageFetchSettings, **hooks: Any) -> APIError:
    with pytest.raises(APIError) as info:
        fetch(url, fetch_settings, **hooks)
    assert info.value.status == 400
    assert info.value.param == FIELD
    return info.value


def loopback_is_public(address: IPAddress) -> str | None:
    """The real policy, but for the test server's own address."""
    return None if address == LOOPBACK else address_refusal(address)


def test_an_image_url_loads_through_load_images(server: Server) -> None:
    limits = LimitsSettings(image_fetch=settings())
    (loaded,) = asyncio.run(load_images([ImageRef(server.url("/cat.png"), FIELD)], limits))
    assert loaded.image.size == (6, 4)
    assert loaded.image.getpixel((0, 0)) == (10, 200, 30)
    assert loaded.nbytes == len(PNG)


def test_a_404_is_refused_with_its_status(server: Server) -> None:
    error = refused(server.url("/missing"), settings())
    assert error.code == "image_fetch_failed"
    assert "HTTP 404" in error.message
    assert "/missing" in error.message


def test_a_redirect_chain_is_followed_up_to_max_redirects(server: Server) -> None:
    assert fetch(server.url("/r1"), settings(max_redirects=3)) == PNG
    error = refused(server.url("/r1"), settings(max_redirects=2))
    assert error.code == "image_fetch_failed"
    assert "limits.image_fetch.max_redirects (2)" in error.message


def test_a_redirect_to_another_scheme_is_refused(server: Server) -> None:
    error = refused(server.url("/to-ftp"), settings())
    assert error.code == "image_url_forbidden"
    assert "ftp URL" in error.message


def test_a_redirect_to_a_broken_url_fails(server: Server) -> None:
    error = refused(server.url("/to-broken"), settings())
    assert error.code == "image_fetch_failed"  # the server's fault, not the client's URL
    assert "location" in error.message.lower()


def test_a_redirect_to_a_private_address_is_refused(server: Server) -> None:
    before = len(server.seen)
    error = refused(
        server.url("/to-private"),
        settings(allow_private_addresses=False),
        refusal=loopback_is_public,
    )
    assert error.code == "image_url_forbidden"
    assert "http://10.0.0.1/cat.png is not fetched: 10.0.0.1 is a private address" in error.message
    assert [path for path, _ in server.seen[before:]] == ["/to-private"]  # the first hop ran


def test_the_checked_address_is_connected_to_under_the_urls_name(server: Server) -> None:
    # "images.test" has no DNS record: only the checked answer can have been used.
    async def resolve(host: str, port: int) -> list[IPAddress]:
        assert (host, port) == ("images.test", server.port)
        return [LOOPBACK]

    before = len(server.seen)
    url = server.url("/cat.png", host="images.test")
    body = fetch(
        url, settings(allow_private_addresses=False), resolve=resolve, refusal=loopback_is_public
    )
    assert body == PNG
    assert server.seen[before:] == [("/cat.png", f"images.test:{server.port}")]


def test_any_non_public_answer_refuses_the_host(server: Server) -> None:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [LOOPBACK, ipaddress.IPv4Address("192.168.1.7")]

    before = len(server.seen)
    url = server.url("/cat.png", host="images.test")
    error = refused(
        url, settings(allow_private_addresses=False), resolve=resolve, refusal=loopback_is_public
    )
    assert error.code == "image_url_forbidden"
    assert "192.168.1.7, a private address" in error.message
    assert server.seen[before:] == []  # refused before connecting anywhere


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_loopback_is_refused_unless_private_addresses_are_allowed(
    server: Server, host: str
) -> None:
    before = len(server.seen)
    error = refused(server.url("/cat.png", host), settings(allow_private_addresses=False))
    assert error.code == "image_url_forbidden"
    assert "a loopback address" in error.message
    assert "limits.image_fetch.allow_private_addresses" in error.message
    assert server.seen[before:] == []
    assert fetch(server.url("/cat.png", host), settings(allow_private_addresses=True)) == PNG


def test_fetching_turned_off_refuses_without_a_request(server: Server) -> None:
    before = len(server.seen)
    error = refused(server.url("/cat.png"), settings(allowed=False))
    assert error.code == "image_fetch_disabled"
    assert "limits.image_fetch.allowed" in error.message
    assert server.seen[before:] == []


@pytest.mark.parametrize("path", ["/big", "/big-unsized"])
def test_a_body_over_max_bytes_is_refused(server: Server, path: str) -> None:
    error = refused(server.url(path), settings(max_bytes=1000))
    assert error.code == "image_too_large"
    assert "limits.image_fetch.max_bytes (1000 bytes)" in error.message
    assert fetch(server.url(path), settings(max_bytes=len(BIG))) == BIG


def test_an_encoded_body_is_refused(server: Server) -> None:
    error = refused(server.url("/gzipped"), settings())
    assert error.code == "image_fetch_failed"
    assert "gzip-encoded" in error.message


def test_a_body_that_never_ends_times_out(server: Server) -> None:
    error = refused(server.url("/slow"), settings(timeout=0.2))
    assert error.code == "image_fetch_timeout"
    assert "limits.image_fetch.timeout (0.2 s)" in error.message


def test_an_unresolvable_host_fails() -> None:
    error = refused("http://no-such-host.invalid/cat.png", settings())
    assert error.code == "image_fetch_failed"
    assert "cannot resolve no-such-host.invalid" in error.message


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata services
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),  # carrier-grade NAT
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:10.0.0.1", "private"),
        ("2002:a00:1::", "private"),  # 6to4 around 10.0.0.1
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 around 169.254.169.254
        ("8.8.8.8", None),
        ("93.184.216.34", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_address_policy(address: str, kind: str | None) -> None:
    assert address_refusal(ipaddress.ip_address(address)) == kind


# --- https: the certificate is checked against the URL's name, not the address --------


@dataclass
class TLSServer:
    port: int
    trust: ssl.SSLContext
    names: list[str | None]  # the SNI name of each handshake


def make_certificate(tmp: Path, name: str) -> tuple[Path, Path, Path]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def subject(common: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(subject("test CA"))
        .issuer_name(subject("test CA"))
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(subject(name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tmp / "ca.pem", tmp / "leaf.pem", tmp / "leaf.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    ca, leaf, key = make_certificate(tmp_path_factory.mktemp("tls"), "images.test")
    names: list[str | None] = []

    def record(sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
        names.append(name)

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(leaf, key)
    context.sni_callback = record  # type: ignore[assignment]
    state = Server(0)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    httpd.daemon_threads = True
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield TLSServer(httpd.server_address[1], ssl.create_default_context(cafile=ca), names)
    httpd.shutdown()
    httpd.server_close()


async def to_loopback(host: str, port: int) -> list[IPAddress]:
    return [LOOPBACK]


def test_https_verifies_the_urls_name_while_connecting_to_the_address(
    tls_server: TLSServer,
) -> None:
    url = f"https://images.test:{tls_server.port}/cat.png"
    before = len(tls_server.names)
    body = fetch(url, settings(), resolve=to_loopback, verify=tls_server.trust)
    assert body == PNG
    assert tls_server.names[before:] == ["images.test"]


def test_https_to_a_name_the_certificate_does_not_name_fails(tls_server: TLSServer) -> None:
    url = f"https://other.test:{tls_server.port}/cat.png"
    error = refused(url, settings(), resolve=to_loopback, verify=tls_server.trust)
    assert error.code == "image_fetch_failed"
    assert "certificate" in error.message.lower()
