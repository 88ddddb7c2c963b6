"""Request images from bytes and data URLs: formats, orientation, frames, digests, and
every refusal (bombs, truncation, unsupported formats, bad data URLs, too many)."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.images import IMAGE_ERROR_CODES, ImageRef, LoadedImage, load_images
from vllm_mlx.api.images import load as load_module
from vllm_mlx.api.images.decode import decode_image
from vllm_mlx.config.images import ImageFetchSettings
from vllm_mlx.config.limits import LimitsSettings

FIELD = "messages[0].content[1].image_url.url"
RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def pattern(width: int = 24, height: int = 16) -> Image.Image:
    """Distinct pixels everywhere, so a shifted or flipped decode would show."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [(x * 10 % 256, y * 15 % 256, (x * y) % 256) for y in range(height) for x in range(width)]
    )
    return image


def refused(call: Callable[[], object]) -> APIError:
    with pytest.raises(APIError) as info:
        call()
    assert info.value.status == 400
    assert info.value.code in IMAGE_ERROR_CODES
    return info.value


def load(urls: list[str], **limits: Any) -> list[LoadedImage]:
    refs = [ImageRef(url, f"messages[0].content[{i}].image_url.url") for i, url in enumerate(urls)]
    return asyncio.run(load_images(refs, LimitsSettings(**limits)))


def test_png_decodes_to_rgb_with_its_sizes() -> None:
    png = encode(pattern(), "PNG")
    loaded = decode_image(png, FIELD, 10_000)
    assert loaded.image.mode == "RGB"
    assert loaded.image.size == (24, 16)
    assert loaded.image.tobytes() == pattern().tobytes()
    assert loaded.nbytes == len(png)
    assert loaded.field == FIELD


def test_same_pixels_in_two_encodings_hash_equal_and_other_pixels_do_not() -> None:
    png = data_url(encode(pattern(), "PNG"))
    webp = data_url(encode(pattern(), "WEBP", lossless=True, exact=True), "image/webp")
    changed = pattern()
    changed.putpixel((3, 2), (1, 2, 3))
    other = data_url(encode(changed, "PNG"))
    a, b, c = load([png, webp, other])
    assert a.digest == b.digest
    assert a.nbytes != b.nbytes  # two encodings indeed
    assert c.digest != a.digest
    assert len(a.digest) == 64
    # The size is hashed too: the same bytes in another shape are another image.
    reshaped = Image.frombytes("RGB", (16, 24), pattern().tobytes())
    assert decode_image(encode(reshaped, "PNG"), FIELD, 10_000).digest != a.digest


def test_images_come_back_in_request_order_with_their_fields() -> None:
    urls = [data_url(encode(Image.new("RGB", (4, 4), colour), "PNG")) for colour in (RED, BLUE)]
    first, second = load(urls)
    assert first.image.getpixel((0, 0)) == RED
    assert second.image.getpixel((0, 0)) == BLUE
    assert (first.field, second.field) == (
        "messages[0].content[0].image_url.url",
        "messages[0].content[1].image_url.url",
    )


def test_exif_rotated_jpeg_comes_out_upright() -> None:
    stored = Image.new("RGB", (40, 20), RED)
    stored.paste(BLUE, (20, 0, 40, 20))  # left red, right blue as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    loaded = decode_image(encode(stored, "JPEG", exif=exif, quality=95), FIELD, 10_000)
    assert loaded.image.size == (20, 40)
    top, bottom = loaded.image.getpixel((10, 5)), loaded.image.getpixel((10, 35))
    assert isinstance(top, tuple) and isinstance(bottom, tuple)
    assert top[0] > 200 and top[2] < 60  # the stored left (red) is now on top
    assert bottom[2] > 200 and bottom[0] < 60


@pytest.mark.parametrize("fmt", ["GIF", "WEBP"])
def test_animation_gives_its_first_frame(fmt: str) -> None:
    frames = [Image.new("RGB", (8, 8), colour) for colour in (RED, BLUE, WHITE)]
    options: dict[str, Any] = {"lossless": True} if fmt == "WEBP" else {}
    data = encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, **options)
    with Image.open(io.BytesIO(data)) as check:
        assert getattr(check, "n_frames", 1) == 3  # the file really is animated
    loaded = decode_image(data, FIELD, 10_000)
    assert loaded.image.mode == "RGB"
    assert loaded.image.getpixel((4, 4)) == RED


def test_transparent_pixels_come_out_white() -> None:
    image = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    image.putpixel((0, 0), (*RED, 255))
    loaded = decode_image(encode(image, "PNG"), FIELD, 10_000)
    assert loaded.image.getpixel((0, 0)) == RED
    assert loaded.image.getpixel((3, 3)) == WHITE


def bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header claiming width x height over a few bytes of data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize(
    ("width", "height", "limit"),
    [
        (100_000, 100_000, 50_000_000),  # past Pillow's own limit (twice ours) too
        (8_000, 8_000, 50_000_000),  # over ours, under twice it: our header check
    ],
)
def test_decompression_bomb_is_refused_from_its_header(width: int, height: int, limit: int) -> None:
    data = bomb_png(width, height)
    assert len(data) < 200  # small on disk; decoding it would need width*height*3 bytes
    error = refused(lambda: decode_image(data, FIELD, limit))
    assert error.code == "image_too_many_pixels"
    assert error.param == FIELD
    assert "limits.max_image_pixels" in error.message
    assert FIELD in error.message


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_an_ordinary_image_over_a_low_pixel_limit_is_refused() -> None:
    url = data_url(encode(pattern(), "PNG"))  # 24x16 = 384 pixels
    error = refused(lambda: load([url], max_image_pixels=300))
    assert error.code == "image_too_many_pixels"
    assert "24x16 (384 pixels)" in error.message
    assert load([url], max_image_pixels=384)[0].image.size == (24, 16)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_file_is_refused(fmt: str) -> None:
    whole = encode(pattern(64, 64), fmt)
    error = refused(lambda: decode_image(whole[: len(whole) // 2], FIELD, 10_000))
    assert error.code == "invalid_image"
    assert f"{fmt} data is truncated or corrupt" in error.message


def test_cut_inside_the_header_is_still_truncated_not_unknown() -> None:
    error = refused(lambda: decode_image(encode(pattern(), "PNG")[:20], FIELD, 10_000))
    assert error.code == "invalid_image"
    assert "PNG data is truncated" in error.message


def test_non_image_is_refused() -> None:
    error = refused(lambda: decode_image(b"hello, this is text\n" * 5, FIELD, 10_000))
    assert error.code == "invalid_image"
    assert "not an image" in error.message


@pytest.mark.parametrize(("fmt", "name"), [("BMP", "BMP"), ("TIFF", "TIFF")])
def test_other_image_formats_are_unsupported_by_name(fmt: str, name: str) -> None:
    data = encode(pattern(), fmt)
    with Image.open(io.BytesIO(data)) as check:
        assert check.format == fmt  # Pillow itself could read it: we refuse on purpose
    error = refused(lambda: load([data_url(data, f"image/{fmt.lower()}")]))
    assert error.code == "unsupported_image_format"
    assert f"{name} images are not supported" in error.message
    assert "PNG, JPEG, WebP or GIF" in error.message


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png," + "iVBORw0KGgo=", "must be base64"),
        ("data:text/plain;base64,aGVsbG8=", "'text/plain' is not an image type"),
        ("data:;base64,aGVsbG8=", "'(none)' is not an image type"),
        ("data:image/png;base64,not*base64!", "not valid base64"),
        ("data:image/png;base64", "must be base64"),
        ("ftp://example.com/cat.png", "data: URL"),
        ("/cat.png", "data: URL"),
    ],
)
def test_bad_urls_are_refused(url: str, words: str) -> None:
    error = refused(lambda: load([url]))
    assert error.code == "invalid_image_url"
    assert words in error.message
    assert error.param == "messages[0].content[0].image_url.url"


def test_data_url_with_line_breaks_and_no_padding_decodes() -> None:
    encoded = base64.b64encode(encode(pattern(), "PNG")).decode().rstrip("=")
    wrapped = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))
    (loaded,) = load([f"data:IMAGE/PNG;base64,{wrapped}"])
    assert loaded.image.size == (24, 16)


def test_data_url_over_max_bytes_is_refused_and_at_the_limit_is_not() -> None:
    png = encode(pattern(), "PNG")
    exact = LimitsSettings(image_fetch=ImageFetchSettings(max_bytes=len(png)))
    ref = ImageRef(data_url(png), FIELD)
    assert asyncio.run(load_images([ref], exact))[0].nbytes == len(png)
    smaller = LimitsSettings(image_fetch=ImageFetchSettings(max_bytes=len(png) - 1))
    error = refused(lambda: asyncio.run(load_images([ref], smaller)))
    assert error.code == "image_too_large"
    assert "limits.image_fetch.max_bytes" in error.message
    huge = ImageRef("data:image/png;base64," + "A" * 4_000_000, FIELD)
    assert refused(lambda: asyncio.run(load_images([huge], smaller))).code == "image_too_large"


def test_data_url_never_fetches_even_with_fetching_off() -> None:
    limits = LimitsSettings(image_fetch=ImageFetchSettings(allowed=False))
    ref = ImageRef(data_url(encode(pattern(), "PNG")), FIELD)
    assert asyncio.run(load_images([ref], limits))[0].image.size == (24, 16)


def test_too_many_images_names_the_first_one_over() -> None:
    url = data_url(encode(pattern(), "PNG"))
    error = refused(lambda: load([url, url, url], max_images_per_request=2))
    assert error.code == "too_many_images"
    assert error.param == "messages[0].content[2].image_url.url"
    assert "3 images" in error.message and "limits.max_images_per_request (2)" in error.message
    assert len(load([url, url], max_images_per_request=2)) == 2


def test_no_images_is_an_empty_list() -> None:
    assert load([]) == []


def test_the_first_failing_image_is_reported() -> None:
    good = data_url(encode(pattern(), "PNG"))
    error = refused(lambda: load([good, "data:text/plain;base64,aGk=", good, "nope"]))
    assert error.param == "messages[0].content[1].image_url.url"


def test_decoding_past_the_time_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def stuck(data: bytes, field: str, max_pixels: int) -> LoadedImage:
        release.wait()  # holds its worker until the test is done
        raise AssertionError("the caller stopped waiting long ago")

    monkeypatch.setattr(load_module, "decode_image", stuck)
    try:
        error = refused(lambda: load([data_url(encode(pattern(), "PNG"))], prompt_timeout=0.05))
    finally:
        release.set()
    assert error.code == "image_decode_timeout"
    assert "limits.prompt_timeout" in error.message


@given(
    fmt=st.sampled_from(["PNG", "JPEG", "GIF", "WEBP"]),
    cut=st.integers(min_value=0, max_value=400),
    flips=st.lists(st.tuples(st.integers(0, 399), st.integers(0, 255)), max_size=8),
)
@settings(max_examples=80, deadline=None)
def test_damaged_files_are_a_400_or_an_image_never_a_crash(
    fmt: str, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(encode(pattern(), fmt))
    for at, value in flips:
        data[at % len(data)] = value
    try:
        loaded = decode_image(bytes(data[: len(data) - cut]), FIELD, 10_000)
    except APIError as error:
        assert error.status == 400
        assert error.code in ("invalid_image", "unsupported_image_format", "image_too_many_pixels")
    else:
        assert loaded.image.mode == "RGB"
