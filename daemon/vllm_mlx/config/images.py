"""`limits.image_fetch`: how image URLs in requests are fetched (docs/vision.md)."""

from __future__ import annotations

from vllm_mlx.config.fields import Reload, Section, setting

DEFAULT_IMAGE_BYTES = 20 * 1024 * 1024


class ImageFetchSettings(Section):
    allowed: bool = setting(
        True,
        Reload.HOT,
        "Fetch `http(s)://` image URLs that requests name. Off: such requests get 400 "
        "and images must come inline (`data:` URLs, base64 sources). Turn it off on a "
        "daemon reachable beyond this machine unless its clients need it.",
    )
    max_bytes: int = setting(
        DEFAULT_IMAGE_BYTES,
        Reload.HOT,
        "Largest encoded image in bytes, fetched or inline; larger gets 400 (a fetch "
        "stops reading there).",
        ge=1,
    )
    timeout: float = setting(
        10.0,
        Reload.HOT,
        "Seconds one image fetch may take in all: name lookups, redirects and the body.",
        gt=0,
    )
    max_redirects: int = setting(
        3,
        Reload.HOT,
        "Redirects followed per image fetch; each hop's scheme and addresses are checked "
        "again. 0: none.",
        ge=0,
        le=20,
    )
    allow_private_addresses: bool = setting(
        False,
        Reload.HOT,
        "Fetch from hosts that resolve to private, loopback, link-local or other "
        "non-public addresses. Off (the default): such fetches get 400, so a request "
        "cannot make the daemon reach this machine or its network (SSRF).",
    )
