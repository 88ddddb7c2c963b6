"""Images in a chat, the same for every protocol (docs/vision.md).

An adapter turns each image it meets into `ImageParts.part(url, field)`: the image's
place in the message content (`{"type": "image"}`, the Hugging Face convention VLM
chat templates render) and a reference to fetch. `chat_prompt` then loads them all
(api/images: fetched, bounded, decoded off the loop), renders the chat to text, and
has the model's processor expand each image into its tiles' tokens: the Prompt holds
the tiles, and its tokens hold the placeholders the engine fills with features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.images import ImageRef, load_images
from vllm_mlx.api.pipeline.chat_template import render_chat, render_chat_text
from vllm_mlx.api.pipeline.turn import Prompt, Turn
from vllm_mlx.models.vision import VisionTower

UNSUPPORTED = "unsupported_content"


class ImageParts:
    """The images of one request's messages, in the order the adapter met them."""

    def __init__(self, tower: VisionTower | None) -> None:
        self.tower = tower
        self.refs: list[ImageRef] = []

    @classmethod
    def of(cls, turn: Turn) -> ImageParts:
        return cls(turn.engine.loaded.vision)

    def part(self, url: str, field: str) -> dict[str, Any]:
        """The content part an image becomes; a 400 naming `field` on a text model."""
        if self.tower is None:
            raise bad_request("model does not accept images", field, UNSUPPORTED)
        if not isinstance(url, str) or not url:
            raise bad_request("an image needs a URL or base64 data", field, "invalid_image")
        self.refs.append(ImageRef(url, field))
        return {"type": "image"}


def content(items: Sequence[str | dict[str, Any]], joiner: str = "") -> str | list[dict[str, Any]]:
    """A message's content: plain text when it has no image (what every template reads),
    else the parts in order, text as `{"type": "text"}`."""
    if all(isinstance(item, str) for item in items):
        return joiner.join(item for item in items if isinstance(item, str))
    return [{"type": "text", "text": item} if isinstance(item, str) else item for item in items]


async def chat_prompt(
    turn: Turn,
    parts: ImageParts,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    template_kwargs: Mapping[str, Any] | None = None,
    *,
    continue_final_message: bool = False,
) -> Prompt:
    """The chat's prompt: rendered as text models are, or with its images' tiles."""
    if not parts.refs:
        return await turn.prompt(
            _render, turn.tokenizer, messages, tools, template_kwargs, continue_final_message
        )
    tower = parts.tower
    assert tower is not None  # ImageParts.part refused images on a text model
    if turn.engine.loaded.lockstep is not None:
        raise bad_request(
            "images are not served by a distributed group yet", parts.refs[0].field, UNSUPPORTED
        )
    images = await load_images(parts.refs, turn.settings.limits)
    if turn.metrics is not None:
        turn.metrics.images_received(turn.name, len(images), sum(i.nbytes for i in images))
    text = await turn.off_loop(
        render_chat_text, turn.tokenizer, messages, tools, template_kwargs, continue_final_message
    )
    pixels = [image.image for image in images]
    try:
        placed, ids, tiles = await turn.off_loop(tower.prepare, text, pixels)
    except ValueError as exc:  # the template dropped an image, or the processor refused
        raise bad_request(f"the images could not be prepared: {exc}", "messages") from exc
    prompt = turn.prompt_of(ids)  # the reasoning check reads real token ids
    return Prompt(placed, prompt.opens_reasoning, tiles)


def _render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    template_kwargs: Mapping[str, Any] | None,
    continue_final_message: bool,
) -> list[int]:
    return render_chat(
        tokenizer, messages, tools, template_kwargs, continue_final_message=continue_final_message
    )
