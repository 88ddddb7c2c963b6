"""Request images: `ImageRef`s (what the client sent, and where) in, `LoadedImage`s
(RGB pixels, a digest, sizes) out, through `load_images` (docs/vision.md).

source.py reads a `data:` URL or hands an `http(s)://` one to fetch.py, which guards
against requests reaching private networks; decode.py opens PNG, JPEG, WebP and GIF
only, refusing decompression bombs from the header. Every failure is a 400 with a
stable `code` (errors.py lists them) that each protocol renders in its own shape.
"""

from __future__ import annotations

from vllm_mlx.api.images.decode import LoadedImage
from vllm_mlx.api.images.errors import IMAGE_ERROR_CODES
from vllm_mlx.api.images.load import load_images
from vllm_mlx.api.images.source import ImageRef

__all__ = ["IMAGE_ERROR_CODES", "ImageRef", "LoadedImage", "load_images"]
