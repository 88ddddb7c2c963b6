"""Encoded bytes -> one RGB picture, in a worker thread (load.py bounds its time).

Only PNG, JPEG, WebP and GIF are opened: each extra Pillow plugin is more parser
exposed to the network. The pixel count is checked from the header before any pixel
is decoded, so a small file claiming a huge canvas (a decompression bomb) costs nothing.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

from PIL import Image, ImageFile, ImageOps

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.images.errors import (
    IMAGE_TOO_MANY_PIXELS,
    INVALID_IMAGE,
    UNSUPPORTED_IMAGE_FORMAT,
    image_error,
)

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
FORMAT_NAMES = "PNG, JPEG, WebP or GIF"

# The leading bytes of each accepted format: a file that starts so but fails to open is
# broken, not "not an image".
_OWN_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)

# Formats worth naming when refused; anything else unopened is "not an image".
_OTHER_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"8BPS", "PSD"),
    (b"%PDF", "PDF"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"qoif", "QOI"),
)
_ISO_MEDIA_BRANDS = {b"avif": "AVIF", b"avis": "AVIF", b"heic": "HEIC", b"heix": "HEIC"}


@dataclass(frozen=True)
class LoadedImage:
    """One decoded request image: RGB, upright (EXIF orientation applied), the first
    frame of an animation. `digest` is sha256 over mode, size and pixels, so equal
    pixels hash equal whatever their encoding; `nbytes` counts the encoded bytes."""

    image: Image.Image
    digest: str
    nbytes: int
    field: str


def decode_image(data: bytes, field: str, max_pixels: int) -> LoadedImage:
    """Decode `data`; every failure is a 400 naming `field` (codes in errors.py)."""
    opened = _open(data, field, max_pixels)
    width, height = opened.size
    if width * height > max_pixels:
        raise _too_many_pixels(field, width, height, max_pixels)
    try:
        opened.load()  # the first frame: an animation is never advanced
        rgb = _rgb(ImageOps.exif_transpose(opened))
    except Exception as exc:  # any decoder failure on untrusted bytes is the client's
        detail = f"the {opened.format or 'image'} data is truncated or corrupt ({exc})"
        raise image_error(field, detail, INVALID_IMAGE) from None
    return LoadedImage(image=rgb, digest=pixel_digest(rgb), nbytes=len(data), field=field)


def pixel_digest(image: Image.Image) -> str:
    """sha256 hex over an image's mode, size and raw pixel bytes."""
    hasher = hashlib.sha256(f"{image.mode};{image.width}x{image.height};".encode())
    hasher.update(image.tobytes())
    return hasher.hexdigest()


def _open(data: bytes, field: str, max_pixels: int) -> ImageFile.ImageFile:
    # Pillow's own bomb check is a backstop (it refuses above twice its limit); it is a
    # process-wide value, the same for every request but for a moment after a reload.
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        return Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:
        raise image_error(
            field,
            f"it has more pixels than limits.max_image_pixels ({max_pixels})",
            IMAGE_TOO_MANY_PIXELS,
        ) from None
    except Exception:  # a parser's failure on untrusted bytes: the client's, never a 500
        raise _unopened(data, field) from None


def _unopened(data: bytes, field: str) -> APIError:
    own = _format_of(data, _OWN_MAGIC) or ("WebP" if _is_webp(data) else None)
    if own is not None:
        return image_error(field, f"the {own} data is truncated or corrupt", INVALID_IMAGE)
    other = _format_of(data, _OTHER_MAGIC) or _iso_media_format(data)
    if other is not None:
        return image_error(
            field,
            f"{other} images are not supported; send {FORMAT_NAMES}",
            UNSUPPORTED_IMAGE_FORMAT,
        )
    return image_error(field, f"the data is not an image ({FORMAT_NAMES})", INVALID_IMAGE)


def _format_of(data: bytes, table: tuple[tuple[bytes, str], ...]) -> str | None:
    return next((name for magic, name in table if data.startswith(magic)), None)


def _is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def _iso_media_format(data: bytes) -> str | None:
    return _ISO_MEDIA_BRANDS.get(data[8:12]) if data[4:8] == b"ftyp" else None


def _too_many_pixels(field: str, width: int, height: int, max_pixels: int) -> APIError:
    return image_error(
        field,
        f"it is {width}x{height} ({width * height} pixels), more than "
        f"limits.max_image_pixels ({max_pixels})",
        IMAGE_TOO_MANY_PIXELS,
    )


def _rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        # Transparent pixels' colour is arbitrary (often black): show them on white,
        # as a viewer would.
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return image.convert("RGB")
