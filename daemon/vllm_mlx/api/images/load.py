"""A request's images, read and decoded together: bytes from their sources at once
(fetches overlap), each decoded in the shared prompt-preparation workers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.images.decode import LoadedImage, decode_image
from vllm_mlx.api.images.errors import IMAGE_DECODE_TIMEOUT, TOO_MANY_IMAGES, image_error
from vllm_mlx.api.images.source import ImageRef, image_bytes
from vllm_mlx.api.pipeline.offload import in_worker
from vllm_mlx.config.limits import LimitsSettings


async def load_images(refs: Sequence[ImageRef], limits: LimitsSettings) -> list[LoadedImage]:
    """Every image `refs` names, decoded, in order; the first failure (by position among
    those that failed) is raised as a 400 and the others are stopped."""
    most = limits.max_images_per_request
    if len(refs) > most:
        over = refs[most].field
        raise bad_request(
            f"The request has {len(refs)} images, more than limits.max_images_per_request "
            f"({most}); the first one over is '{over}'",
            over,
            TOO_MANY_IMAGES,
        )
    if not refs:
        return []
    tasks = [asyncio.ensure_future(_load(ref, limits)) for ref in refs]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()  # none on success; the rest after a failure or our own cancel
    failed = [task for task in tasks if task.done() and not task.cancelled() and task.exception()]
    if failed:
        await asyncio.gather(*tasks, return_exceptions=True)  # the stopped ones, settled
        error = failed[0].exception()
        assert error is not None
        raise error
    return [task.result() for task in tasks]


async def _load(ref: ImageRef, limits: LimitsSettings) -> LoadedImage:
    data = await image_bytes(ref, limits.image_fetch)
    try:
        # asyncio.timeout, not wait_for: wait_for on 3.11 can swallow a cancellation.
        async with asyncio.timeout(limits.prompt_timeout):
            return await in_worker(decode_image, data, ref.field, limits.max_image_pixels)
    except TimeoutError:
        detail = f"decoding took longer than limits.prompt_timeout ({limits.prompt_timeout:g} s)"
        raise image_error(ref.field, detail, IMAGE_DECODE_TIMEOUT) from None
