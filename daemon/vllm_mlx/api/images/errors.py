"""The 400s an image input can get, each with a stable `code` clients can branch on.

- `too_many_images`: more than `limits.max_images_per_request` (the field of the first
  one over the limit is named).
- `invalid_image_url`: neither a `data:` URL nor an `http(s)://` URL, or a data URL
  that is not base64 or whose media type is not `image/*`.
- `image_fetch_disabled`: an `http(s)://` URL while `limits.image_fetch.allowed` is off.
- `image_url_forbidden`: the URL (or a redirect) names a host with a non-public address
  (private, loopback, link-local, unspecified, multicast, reserved) while
  `limits.image_fetch.allow_private_addresses` is off, or redirects to a scheme other
  than http/https.
- `image_fetch_failed`: the host cannot be resolved or reached, answers other than 2xx,
  redirects more than `limits.image_fetch.max_redirects` times, or sends an encoded body.
- `image_fetch_timeout`: the fetch took longer than `limits.image_fetch.timeout`.
- `image_too_large`: more encoded bytes than `limits.image_fetch.max_bytes`.
- `image_too_many_pixels`: more pixels than `limits.max_image_pixels` (from the header,
  before any pixel is decoded).
- `unsupported_image_format`: an image, but not PNG, JPEG, WebP or GIF.
- `invalid_image`: not an image at all, or a truncated or corrupt one.
- `image_decode_timeout`: decoding took longer than `limits.prompt_timeout`.
"""

from __future__ import annotations

from vllm_mlx.api.errors import APIError, bad_request

TOO_MANY_IMAGES = "too_many_images"
INVALID_IMAGE_URL = "invalid_image_url"
IMAGE_FETCH_DISABLED = "image_fetch_disabled"
IMAGE_URL_FORBIDDEN = "image_url_forbidden"
IMAGE_FETCH_FAILED = "image_fetch_failed"
IMAGE_FETCH_TIMEOUT = "image_fetch_timeout"
IMAGE_TOO_LARGE = "image_too_large"
IMAGE_TOO_MANY_PIXELS = "image_too_many_pixels"
UNSUPPORTED_IMAGE_FORMAT = "unsupported_image_format"
INVALID_IMAGE = "invalid_image"
IMAGE_DECODE_TIMEOUT = "image_decode_timeout"

IMAGE_ERROR_CODES = (
    TOO_MANY_IMAGES,
    INVALID_IMAGE_URL,
    IMAGE_FETCH_DISABLED,
    IMAGE_URL_FORBIDDEN,
    IMAGE_FETCH_FAILED,
    IMAGE_FETCH_TIMEOUT,
    IMAGE_TOO_LARGE,
    IMAGE_TOO_MANY_PIXELS,
    UNSUPPORTED_IMAGE_FORMAT,
    INVALID_IMAGE,
    IMAGE_DECODE_TIMEOUT,
)

SHOWN_URL_CHARS = 120


def image_error(field: str, detail: str, code: str) -> APIError:
    """A 400 about the image at `field`; the message names the field, since not every
    protocol's error body carries `param`."""
    return bad_request(f"Invalid image at '{field}': {detail}", field, code)


def shown_url(url: str) -> str:
    """A URL as quoted in an error message: never a data URL's payload, never unbounded."""
    if url[:5].lower() == "data:":
        return url.partition(",")[0] + ",..."
    return url if len(url) <= SHOWN_URL_CHARS else url[:SHOWN_URL_CHARS] + "..."


def too_large(field: str, max_bytes: int, size: int | None = None) -> APIError:
    """`image_too_large`; `size` when known (a streamed body stops at the limit)."""
    amount = "it is larger" if size is None else f"it is {size} bytes, more"
    detail = f"{amount} than limits.image_fetch.max_bytes ({max_bytes} bytes)"
    return image_error(field, detail, IMAGE_TOO_LARGE)
