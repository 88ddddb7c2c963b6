"""The `ollama` section of vllm-mlx.yaml: a second listener on Ollama's own port.

Apps that speak only Ollama's API often cannot be pointed anywhere but
127.0.0.1:11434; `ollama.listen` serves the same app there too (every route, the same
keys, limits and metrics), so they work with no configuration. docs/ollama.md.
"""

from __future__ import annotations

import ipaddress

from pydantic import field_validator

from vllm_mlx.config.fields import Reload, Section, setting

UNSPECIFIED = {"0.0.0.0", "::"}


def parse_address(value: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets, `[::1]:11434`) as (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{value!r} is not HOST:PORT, e.g. 127.0.0.1:11434")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        # The listener (Granian) binds IP literals only, as for server.host.
        raise ValueError(
            f"{host!r} is not an IP address; use one, e.g. 127.0.0.1:11434 (this machine "
            f"only) or 0.0.0.0:11434 (every IPv4 interface)"
        ) from None
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is not between 1 and 65535")
    return host, port


def overlaps(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Two listeners that could not both bind: one port, and one host or a wildcard."""
    return a[1] == b[1] and (a[0] == b[0] or a[0] in UNSPECIFIED or b[0] in UNSPECIFIED)


class OllamaSettings(Section):
    listen: str | None = setting(
        None,
        Reload.RESTART,
        "A second address the daemon also serves on, as `HOST:PORT`, for apps that only "
        "look at Ollama's port: `127.0.0.1:11434` (stop Ollama itself first). Off by "
        "default. Every route is served there with the same keys and limits; a restart "
        "applies a change.",
    )

    @field_validator("listen")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_address(value)
        return value

    def address(self) -> tuple[str, int] | None:
        return None if self.listen is None else parse_address(self.listen)
