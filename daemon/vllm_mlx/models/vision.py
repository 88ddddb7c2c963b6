"""Vision-language models: mlx-vlm's vision tower and processor, mlx-lm's text model.

A VLM directory (its config.json has a `vision_config`) loads through mlx-vlm, which
owns the architecture, weight sanitizing and the image processor. Its language model's
weights then move into the mlx-lm model of the same architecture, so the text half is
an ordinary generation model to the engine: continuous batching, the quantized CPU
kernel, the prefix cache, KV quantization and LoRA all apply unchanged. What stays
here is the tower (mlx-vlm's vision model and connector) and the processor.

Images reach the text model through its token embedding (`PlaceholderEmbedding`):
each image token of the prompt is replaced by a placeholder id above the vocabulary,
derived from the pixels of its tile and its position in the tile, and the embedding
looks those ids up in a table of vision features the engine fills when it encodes the
tile. So an image row prefills in the same batch as text rows, in mlx-lm's own chunks,
and the prefix cache keys an image by its pixels: the same image and prompt hit, a
different image misses from its first token.

Exercised here: `smolvlm` and `idefics3` (SmolVLM, SmolVLM2, Idefics3: a SigLIP tower,
a pixel-shuffle connector, a llama text model). Other mlx-vlm architectures need their
own tile layout and are refused at load with the list of supported ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Architectures whose images become equal-length runs of one image token, a tile per
# run, filled in order by the tower's features (mlx-vlm's idefics3 masked scatter).
SUPPORTED = ("idefics3", "smolvlm")
_ID_SPACE = 2**31 - 1  # placeholder ids stay int32 (mlx-lm's token arrays)


def vision_config_of(model_dir: Path) -> dict[str, Any] | None:
    """The model's config.json when it declares a vision tower, else None."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and config.get("vision_config") else None


@dataclass(frozen=True)
class ImageTiles:
    """A prompt's images as the tower takes them: tiles in prompt order, each filling the
    `lengths[t]` image-token positions from `starts[t]` (numpy only: built off the engine)."""

    pixels: Any  # np.ndarray float (tiles, channels, height, width)
    masks: Any  # np.ndarray bool (tiles, height, width), or None
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    images: int

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def placeholder_positions(self) -> list[int]:
        return [s + k for s, n in zip(self.starts, self.lengths, strict=True) for k in range(n)]


@dataclass
class FeatureTable:
    """Placeholder id -> (features, row) for tiles being prefilled; engine thread only.

    Counted per id: two requests with the same image (or one request's n choices) hold
    the same ids, and one finishing must not drop rows the other still reads."""

    rows: dict[int, tuple[Any, int]] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)
    owners: dict[str, list[int]] = field(default_factory=dict)

    def add(self, owner: str, ids: list[int], features: Any) -> None:
        self.owners.setdefault(owner, []).extend(ids)
        for row, pid in enumerate(ids):
            self.rows[pid] = (features, row)
            self.refs[pid] = self.refs.get(pid, 0) + 1

    def drop(self, owner: str) -> None:
        for pid in self.owners.pop(owner, []):
            left = self.refs.get(pid, 1) - 1
            if left > 0:
                self.refs[pid] = left
            else:
                self.refs.pop(pid, None)
                self.rows.pop(pid, None)

    def clear(self) -> None:
        self.rows.clear()
        self.refs.clear()
        self.owners.clear()


@dataclass
class VisionTower:
    """A VLM's image half: mlx-vlm's processor (API threads) and tower (engine thread)."""

    model_type: str
    encoder: Any  # mlx-vlm Model without its language model
    processor: Any  # the transformers ProcessorMixin mlx-vlm loads
    image_token_id: int
    hidden_size: int
    vocab_size: int  # placeholder ids start here (the text model's embedding rows)
    # vision_model.tower_features, handed in by the loader: this module stays free of
    # mlx so the API threads can import it without the engine's imports.
    features: Callable[[Any, int, Any, Any, int], Any]
    table: FeatureTable = field(default_factory=FeatureTable)

    def prepare(self, text: str, images: list[Any]) -> tuple[list[int], list[int], ImageTiles]:
        """(prompt ids with placeholders, the same ids with the image token, the tiles)
        for a rendered chat `text` holding one image token per image, in order."""
        out = self.processor(text=[text], images=[images], return_tensors="np")
        ids = [int(t) for t in np.asarray(out["input_ids"])[0]]
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        pixels = pixels.reshape(-1, *pixels.shape[-3:])
        masks = out.get("pixel_attention_mask")
        if masks is not None:
            masks = np.asarray(masks, dtype=bool).reshape(-1, *np.asarray(masks).shape[-2:])
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        tiles = len(pixels)
        if not tiles or len(positions) % tiles:
            raise ValueError(
                f"the processor made {len(positions)} image tokens for {tiles} image tiles"
            )
        per_tile = len(positions) // tiles
        starts = tuple(positions[t * per_tile] for t in range(tiles))
        tiled = ImageTiles(pixels, masks, starts, (per_tile,) * tiles, len(images))
        placed = list(ids)
        for t, start in enumerate(starts):
            for k, pid in enumerate(self.placeholder_ids(pixels[t], per_tile)):
                placed[start + k] = pid
        return placed, ids, tiled

    def placeholder_ids(self, tile: Any, count: int) -> list[int]:
        """`count` ids above the vocabulary for one tile's tokens, from its pixels: the
        prefix cache key of an image is its content."""
        digest = hashlib.sha256(np.ascontiguousarray(tile).tobytes()).digest()
        span = _ID_SPACE - self.vocab_size
        ids = []
        for k in range(count):
            mixed = hashlib.blake2b(digest + k.to_bytes(4, "little"), digest_size=8).digest()
            ids.append(self.vocab_size + int.from_bytes(mixed, "little") % span)
        return ids

    def encode(self, pixels: Any, masks: Any, tokens: int) -> Any:
        """The tower's features for these tiles, (tokens, hidden): mlx-vlm's own
        embedding path, scattered into `tokens` image-token positions."""
        return self.features(self.encoder, self.image_token_id, pixels, masks, tokens)
