"""Where a request image's bytes come from: a `data:` URL decoded here, or an
`http(s)://` URL fetched (fetch.py). A data URL never fetches anything."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from vllm_mlx.api.images.errors import INVALID_IMAGE_URL, image_error, too_large
from vllm_mlx.api.images.fetch import fetch_image
from vllm_mlx.config.images import ImageFetchSettings


@dataclass(frozen=True)
class ImageRef:
    """One image as the client sent it: `url` is a `data:` URL (base64) or an
    `http(s)://` URL (an Anthropic base64 source arrives as a data URL built from its
    `media_type` and `data`); `field` is the request field's path, for errors
    (`messages[0].content[1].image_url.url`)."""

    url: str
    field: str


async def image_bytes(ref: ImageRef, settings: ImageFetchSettings) -> bytes:
    """The encoded image `ref` names, at most `settings.max_bytes` of it."""
    scheme = ref.url.partition(":")[0].lower()
    if scheme == "data":
        return data_url_bytes(ref.url, ref.field, settings.max_bytes)
    if scheme in ("http", "https") and ref.url[len(scheme) : len(scheme) + 3] == "://":
        return await fetch_image(ref.url, ref.field, settings)
    raise image_error(
        ref.field,
        "the URL must be a data: URL (data:image/png;base64,...) or an http(s):// URL",
        INVALID_IMAGE_URL,
    )


def data_url_bytes(url: str, field: str, max_bytes: int) -> bytes:
    """The bytes of a base64 `data:image/...` URL (RFC 2397)."""
    header, comma, payload = url.partition(",")
    params = [part.strip().lower() for part in header[len("data:") :].split(";")]
    media_type = params[0]
    if not comma or "base64" not in params[1:]:
        raise image_error(
            field, "a data URL must be base64: data:image/png;base64,<data>", INVALID_IMAGE_URL
        )
    if not media_type.startswith("image/"):
        raise image_error(
            field,
            f"the data URL's media type {media_type or '(none)'!r} is not an image type "
            "(image/png, image/jpeg, image/webp, image/gif)",
            INVALID_IMAGE_URL,
        )
    compact = "".join(payload.split())  # line breaks some encoders insert
    if len(compact) // 4 * 3 > max_bytes + 2:  # refused before decoding any of it
        raise too_large(field, max_bytes, len(compact) // 4 * 3)
    try:
        data = base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        message = "the data URL's data is not valid base64"
        raise image_error(field, message, INVALID_IMAGE_URL) from None
    if len(data) > max_bytes:
        raise too_large(field, max_bytes, len(data))
    return data
