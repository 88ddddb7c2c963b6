"""A tiny random-weight vision-language model in mlx-vlm's format (SmolVLM architecture).

No VLM's weights can be downloaded here and none ships in a PyPI package, so the tests
build one with mlx-vlm's own model classes and save functions: a 2-layer SigLIP-style
vision tower (patch 8, 32x32 tiles: 16 patches, pixel-shuffled by 2 into 4 image tokens
per tile), the connector, and a 2-layer llama text model. The tokenizer is the bundled
SmolLM2's with SmolVLM's image tokens added, and the processor files are SmolVLM's
(`Idefics3ImageProcessor` splitting an image into 32x32 tiles plus a global view).

Scaled as tiny_model.py's llama is, so greedy is decisive and the image matters: the
projections x3 make the layers count and a separate lm_head x10 spreads the logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.tiny_model import TINY

TILE = 32  # the vision tower's image size: each tile is TILE x TILE pixels
PATCH = 8
SCALE = 2  # pixel shuffle: (TILE / PATCH)^2 / SCALE^2 = 4 tokens per tile
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE**2
LONGEST_EDGE = 64  # images are resized to at most 64 px: up to 2x2 tiles + the global one

# SmolVLM's special tokens; the row/col tags the processor writes before each tile.
IMAGE_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    "<end_of_utterance>",
] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]

VISION = {
    "model_type": "smolvlm_vision",
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "patch_size": PATCH,
    "image_size": TILE,
    "num_channels": 3,
    "layer_norm_eps": 1e-6,
}

# SmolVLM's chat template (User:/Assistant: turns, images as <image> in the content).
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}: {{ message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def _tokenizer_with_image_tokens(source: Path, directory: Path) -> int:
    """The bundled tokenizer files in `directory`, SmolVLM's tokens added; the new size."""
    from tokenizers import AddedToken, Tokenizer

    for item in source.iterdir():
        skipped = item.name in ("config.json", "model.safetensors.index.json")
        if item.is_file() and not skipped and not item.name.endswith((".safetensors", ".gguf")):
            shutil.copy(item, directory / item.name)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config.pop("chat_template", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=1))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def make_tiny_vlm(directory: Path, tokenizer_dir: Path, seed: int = 7) -> Path:
    """Write a random SmolVLM to `directory` (weights, config, tokenizer, processor)."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_vlm.models import smolvlm
    from mlx_vlm.utils import save_config, save_weights, update_module_configs

    directory.mkdir(parents=True, exist_ok=True)
    vocab = _tokenizer_with_image_tokens(tokenizer_dir, directory)
    from tokenizers import Tokenizer

    image_token_id = Tokenizer.from_file(str(directory / "tokenizer.json")).token_to_id("<image>")
    text = {**TINY, "model_type": "llama", "vocab_size": max(vocab, TINY["vocab_size"])}
    config: dict[str, Any] = {
        "model_type": "smolvlm",
        "architectures": ["SmolVLMForConditionalGeneration"],
        "text_config": text,
        "vision_config": VISION,
        "scale_factor": SCALE,
        "image_token_id": image_token_id,
        "vocab_size": text["vocab_size"],
        "eos_token_id": [2],
    }
    mx.random.seed(seed)
    model_config = smolvlm.ModelConfig.from_dict(config)
    model_config = update_module_configs(model_config, smolvlm, config, ["text", "vision"])
    model = smolvlm.Model(model_config)

    def scaled(path: str, value: Any) -> Any:
        if path.startswith("language_model."):
            factor = 3.0 if path.endswith("proj.weight") else 10.0 if "lm_head" in path else 1
        else:  # the tower and connector: enough gain that the image moves the text
            factor = 4.0 if path.startswith("connector.") else 1
        return (value * factor).astype(mx.float32)

    model.update(tree_map_with_path(scaled, model.parameters()))
    mx.eval(model.parameters())
    save_weights(directory, model)
    save_config(config, directory / "config.json")
    (directory / "processor_config.json").write_text(
        json.dumps({"image_seq_len": IMAGE_SEQ_LEN, "processor_class": "SmolVLMProcessor"})
    )
    (directory / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "SmolVLMImageProcessor",
                "processor_class": "SmolVLMProcessor",
                "do_convert_rgb": True,
                "do_resize": True,
                "size": {"longest_edge": LONGEST_EDGE},
                "resample": 1,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "do_pad": True,
                "do_image_splitting": True,
                "max_image_size": {"longest_edge": TILE},
            }
        )
    )
    return directory
