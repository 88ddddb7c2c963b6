"""Fetching an `http(s)://` image URL without letting a request reach private networks.

A request that names a URL makes the daemon a client on the requester's behalf (SSRF):
`http://169.254.169.254/` would read a cloud metadata service, `http://127.0.0.1:…/`
another local service. So each hop's host is resolved here, every address it resolves
to is checked, and the connection goes to the checked address itself (the URL's host
stays in the Host header and, for https, in SNI and the certificate check), so a second
DNS answer cannot differ from the one checked (DNS rebinding). Redirects are followed
here, each hop checked the same way. No proxy from the environment is used: a proxy
would resolve the name itself.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable

import httpx

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.images.errors import (
    IMAGE_FETCH_DISABLED,
    IMAGE_FETCH_FAILED,
    IMAGE_FETCH_TIMEOUT,
    IMAGE_URL_FORBIDDEN,
    INVALID_IMAGE_URL,
    image_error,
    shown_url,
    too_large,
)
from vllm_mlx.config.images import ImageFetchSettings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
Refusal = Callable[[IPAddress], "str | None"]

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_HEADERS = {"Accept": "image/*", "Accept-Encoding": "identity", "User-Agent": "vllm-mlx"}


def address_refusal(address: IPAddress) -> str | None:
    """The kind of non-public network `address` is in (why it is refused), else None."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:  # an IPv4 address in IPv6 clothing is judged as itself
            return address_refusal(embedded)
    kinds = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("non-public", not address.is_global),
    )
    return next((kind for kind, applies in kinds if applies), None)


async def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, in the resolver's order (an IP literal: itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = ipaddress.ip_address(sockaddr[0])
            if address not in found:
                found.append(address)
    return found


async def fetch_image(
    url: str,
    field: str,
    settings: ImageFetchSettings,
    *,
    resolve: Resolver = resolve_host,
    refusal: Refusal = address_refusal,
    verify: ssl.SSLContext | bool = True,
) -> bytes:
    """The body of `url` (at most `settings.max_bytes`), redirects followed and every
    hop's addresses checked; a 400 naming `field` otherwise (codes in errors.py).
    `resolve`, `refusal` and `verify` are the name lookup, the address policy and the
    TLS trust used (tests point them elsewhere)."""
    if not settings.allowed:
        raise image_error(
            field,
            "fetching image URLs is turned off (limits.image_fetch.allowed); send the "
            "image inline as a data: URL",
            IMAGE_FETCH_DISABLED,
        )
    hop = _Hop(field, settings, resolve, refusal)
    trust = _default_trust() if verify is True else verify
    try:
        async with asyncio.timeout(settings.timeout):
            async with httpx.AsyncClient(
                verify=trust, trust_env=False, follow_redirects=False, timeout=settings.timeout
            ) as client:
                return await hop.follow(client, url)
    except (TimeoutError, httpx.TimeoutException):
        raise image_error(
            field,
            f"fetching {shown_url(url)} took longer than limits.image_fetch.timeout "
            f"({settings.timeout:g} s)",
            IMAGE_FETCH_TIMEOUT,
        ) from None


@functools.cache
def _default_trust() -> ssl.SSLContext:
    # Reading the CA bundle takes ~30 ms: once per process, not per fetch on the loop.
    return httpx.create_ssl_context()


class _Hop:
    """The steps of one fetch, each hop checked alike."""

    def __init__(
        self, field: str, settings: ImageFetchSettings, resolve: Resolver, refusal: Refusal
    ) -> None:
        self.field = field
        self.settings = settings
        self.resolve = resolve
        self.refusal = refusal

    async def follow(self, client: httpx.AsyncClient, url: str) -> bytes:
        current = self.parse(url)
        for _ in range(self.settings.max_redirects + 1):
            response = await self.send(client, current)
            try:
                if not response.is_redirect:
                    return await self.body(current, response)
                current = self.parse(response.headers["location"], current)
            finally:
                await response.aclose()
        raise self.failed(
            url,
            f"more than limits.image_fetch.max_redirects ({self.settings.max_redirects}) redirects",
        )

    def parse(self, url: str, redirected_from: httpx.URL | None = None) -> httpx.URL:
        """`url`, or a redirect's Location read against the URL that sent it, checked."""
        try:
            parsed = httpx.URL(url) if redirected_from is None else redirected_from.join(url)
        except httpx.InvalidURL as exc:
            raise image_error(self.field, f"not a valid URL ({exc})", INVALID_IMAGE_URL) from None
        if parsed.scheme not in ("http", "https"):
            if redirected_from is None:
                detail = f"{shown_url(url)} is not an http(s) URL"
                raise image_error(self.field, detail, INVALID_IMAGE_URL)
            scheme = parsed.scheme or "schemeless"
            detail = (
                f"{shown_url(str(redirected_from))} redirects to a {scheme} URL; only http "
                "and https are fetched"
            )
            raise image_error(self.field, detail, IMAGE_URL_FORBIDDEN)
        if not parsed.host:
            raise image_error(self.field, f"{shown_url(url)} names no host", INVALID_IMAGE_URL)
        return parsed

    async def addresses(self, url: httpx.URL) -> list[IPAddress]:
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            found = await self.resolve(url.host, port)
        except OSError as exc:
            raise self.failed(str(url), f"cannot resolve {url.host} ({exc})") from None
        if not found:
            raise self.failed(str(url), f"{url.host} resolves to no address")
        if not self.settings.allow_private_addresses:
            for address in found:  # any one: the connection could go to each of them
                if (kind := self.refusal(address)) is not None:
                    raise self.forbidden(url, address, kind)
        return found

    async def send(self, client: httpx.AsyncClient, url: httpx.URL) -> httpx.Response:
        """The streamed response from the first checked address that accepts a connection."""
        error: httpx.HTTPError | None = None
        for address in await self.addresses(url):
            try:
                return await client.send(_request(client, url, address), stream=True)
            except httpx.ConnectError as exc:
                error = exc  # the next address may answer
            except httpx.TimeoutException:
                raise
            except httpx.HTTPError as exc:
                raise self.failed(str(url), str(exc) or type(exc).__name__) from None
        raise self.failed(str(url), f"cannot connect ({error})")

    async def body(self, url: httpx.URL, response: httpx.Response) -> bytes:
        if not response.is_success:
            raise self.failed(str(url), f"the server answered HTTP {response.status_code}")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise self.failed(str(url), f"the body is {encoding}-encoded; send it unencoded")
        limit = self.settings.max_bytes
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large(self.field, limit, int(length))
        data = bytearray()
        try:
            async for chunk in response.aiter_raw():
                data += chunk
                if len(data) > limit:
                    raise too_large(self.field, limit)
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as exc:
            raise self.failed(str(url), f"the body broke off ({exc})") from None
        return bytes(data)

    def forbidden(self, url: httpx.URL, address: IPAddress, kind: str) -> APIError:
        named = url.host != str(address)
        where = f"{url.host} resolves to {address}, a" if named else f"{url.host} is a"
        detail = (
            f"{shown_url(str(url))} is not fetched: {where} {kind} address (set "
            "limits.image_fetch.allow_private_addresses to allow such addresses)"
        )
        return image_error(self.field, detail, IMAGE_URL_FORBIDDEN)

    def failed(self, url: str, detail: str) -> APIError:
        return image_error(
            self.field, f"fetching {shown_url(url)} failed: {detail}", IMAGE_FETCH_FAILED
        )


def _request(client: httpx.AsyncClient, url: httpx.URL, address: IPAddress) -> httpx.Request:
    # The URL's name stays in the Host header and, for https, in SNI, where the
    # certificate is checked against it; only the TCP connection goes to `address`.
    headers = {**_HEADERS, "Host": url.netloc.decode("ascii")}
    extensions = {}
    if url.scheme == "https" and not _is_ip(url.host):
        extensions["sni_hostname"] = url.host
    target = url.copy_with(host=str(address))
    return client.build_request("GET", target, headers=headers, extensions=extensions)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
