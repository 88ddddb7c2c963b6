"""Images in, on a real daemon serving a tiny random SmolVLM (tests/support/tiny_vlm.py),
through the official SDKs: greedy text equal to mlx-vlm's own `generate`, the image
mattering, batch invariance beside text rows, every protocol's image spelling, the
prefix cache keyed by pixels, and bad images refused in each protocol's error shape
while the daemon keeps serving. One daemon for the module."""

from __future__ import annotations

import base64
import concurrent.futures
import http.server
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anthropic
import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape, value
from tests.support.tiny_model import bundled_tokenizer_dir
from tests.support.tiny_vlm import make_tiny_vlm

MODEL = "tiny-vlm"
QUESTION = "What is in this picture?"
MAX_TOKENS = 12


def picture(seed: int, size: tuple[int, int] = (56, 44)) -> Image.Image:
    pixels = np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(image: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(png(image)).decode()


class _Images(http.server.BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    _Images.files = {"/one.png": png(picture(1)), "/two.png": png(picture(2))}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path) -> Path:
    tokenizer = bundled_tokenizer_dir(model_cache_dir)
    return make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), tokenizer)


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path, vlm_dir: Path
) -> Iterator[DaemonProcess]:
    config = {
        "models": [
            # float32: the reference (mlx-vlm) computes in float32 too.
            {"name": MODEL, "source": str(vlm_dir), "dtype": "float32"},
            {"name": "smol", "source": "builtin:smollm2-135m-instruct"},
        ],
        # The test's image server is on loopback.
        "limits": {"image_fetch": {"allow_private_addresses": True}, "max_images_per_request": 4},
        "metrics": {"enabled": True},
        "defaults": {"temperature": 0.0},  # greedy (the Anthropic SDK sends none)
    }
    with running(tmp_path_factory.mktemp("vision"), model_cache_dir, config) as process:
        yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


def image_message(*urls: str, text: str = QUESTION) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def ask(client: openai.OpenAI, message: dict[str, Any], **extra: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=[message], max_tokens=MAX_TOKENS, temperature=0, **extra
    )


def reference(vlm_dir: Path, images: list[Image.Image], text: str = QUESTION) -> str:
    """mlx-vlm's own greedy generate for the same image and prompt."""
    from mlx_vlm import generate, load

    model, processor = load(str(vlm_dir))
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True
    )
    result = generate(
        model, processor, prompt, image=images, max_tokens=MAX_TOKENS, temperature=0.0
    )
    return str(result.text)


def test_greedy_text_equals_mlx_vlm_generate(client: openai.OpenAI, vlm_dir: Path) -> None:
    image = picture(1)
    reply = ask(client, image_message(data_url(image)))
    expected = reference(vlm_dir, [image])
    assert reply.choices[0].message.content == expected
    # The image's tokens count: the processor's expansion, not one token per image.
    assert reply.usage.prompt_tokens > 40


def test_the_image_matters(client: openai.OpenAI) -> None:
    one = ask(client, image_message(data_url(picture(1)))).choices[0].message.content
    two = ask(client, image_message(data_url(picture(2)))).choices[0].message.content
    none = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert one != two
    assert none.choices[0].message.content not in (one, two)


def test_an_image_row_is_batch_invariant(client: openai.OpenAI) -> None:
    message = image_message(data_url(picture(3)), text="Describe it.")
    alone = ask(client, message).choices[0].message.content
    texts = [f"Tell me about the number {n}." for n in range(7)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        others = [
            pool.submit(
                client.chat.completions.create,
                model=MODEL,
                messages=[{"role": "user", "content": t}],
                max_tokens=24,
                temperature=0,
            )
            for t in texts
        ]
        batched = pool.submit(ask, client, message)
        assert batched.result().choices[0].message.content == alone
        assert all(f.result().choices[0].message.content for f in others)


def test_a_url_and_several_images_in_one_message(
    client: openai.OpenAI, image_server: str, vlm_dir: Path
) -> None:
    fetched = ask(client, image_message(f"{image_server}/one.png"))
    inline = ask(client, image_message(data_url(picture(1))))
    assert fetched.choices[0].message.content == inline.choices[0].message.content
    both = ask(client, image_message(f"{image_server}/one.png", data_url(picture(2))))
    expected = reference(vlm_dir, [picture(1), picture(2)])
    assert both.choices[0].message.content == expected
    assert both.usage.prompt_tokens > fetched.usage.prompt_tokens


def test_the_prefix_cache_keys_images_by_their_pixels(client: openai.OpenAI) -> None:
    first = ask(client, image_message(data_url(picture(4)), text="Once more."))
    again = ask(client, image_message(data_url(picture(4)), text="Once more."))
    other = ask(client, image_message(data_url(picture(5)), text="Once more."))
    assert again.choices[0].message.content == first.choices[0].message.content
    cached_again = again.usage.prompt_tokens_details.cached_tokens
    cached_other = other.usage.prompt_tokens_details.cached_tokens
    assert cached_again == again.usage.prompt_tokens - 1  # all but the last token
    # A different image misses from its first token: only the text before it is shared.
    assert cached_other < 8


def test_anthropic_base64_and_url_sources(daemon: DaemonProcess, image_server: str) -> None:
    claude = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0)
    encoded = base64.b64encode(png(picture(1))).decode()
    sources: list[Any] = [
        {"type": "base64", "media_type": "image/png", "data": encoded},
        {"type": "url", "url": f"{image_server}/one.png"},
    ]
    replies = []
    for source in sources:
        reply = claude.messages.create(
            model=MODEL,
            max_tokens=MAX_TOKENS,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": source},
                        {"type": "text", "text": QUESTION},
                    ],
                }
            ],
        )
        replies.append(reply.content[0].text)  # type: ignore[union-attr]
        # input_tokens leaves out what the prefix cache read (the earlier tests' image).
        charged = reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
        assert charged > 40
    assert replies[0] == replies[1]
    count = claude.messages.count_tokens(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": sources[0]},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
    )
    assert count.input_tokens == charged


def test_responses_input_image(client: openai.OpenAI) -> None:
    image = picture(1)
    response = client.responses.create(
        model=MODEL,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_url(image), "detail": "auto"},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
    )
    chat = ask(client, image_message(data_url(image)))
    assert response.output_text == chat.choices[0].message.content


def test_bad_images_get_400s_and_the_daemon_keeps_serving(
    client: openai.OpenAI, daemon: DaemonProcess, image_server: str
) -> None:
    bomb = io.BytesIO()
    Image.new("L", (12000, 12000)).save(bomb, format="PNG")
    cases = {
        "data:image/png;base64,bm90IGFuIGltYWdl": "invalid_image",  # "not an image"
        "data:image/png;base64," + base64.b64encode(png(picture(1))[:200]).decode(): None,
        "data:image/png;base64," + base64.b64encode(bomb.getvalue()).decode(): None,
        f"{image_server}/missing.png": "image_fetch_failed",
    }
    for url, code in cases.items():
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, image_message(url))
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["param"] == "messages[0].content[0].image_url.url"
        if code is not None:
            assert error["code"] == code
    with pytest.raises(openai.BadRequestError) as too_many:
        ask(client, image_message(*[data_url(picture(1))] * 5))
    assert isinstance(too_many.value.body, dict)
    assert too_many.value.body["param"] == "messages[0].content[4].image_url.url"
    with pytest.raises(openai.BadRequestError) as text_model:
        client.chat.completions.create(
            model="smol", messages=[image_message(data_url(picture(1)))], max_tokens=4
        )
    assert "does not accept images" in str(text_model.value)
    claude = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as anthropic_error:
        claude.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        }
                    ],
                }
            ],
        )
    assert anthropic_error.value.body["type"] == "error"  # type: ignore[index]
    # Still serving, images and text alike.
    assert ask(client, image_message(data_url(picture(1)))).choices[0].message.content


def test_tokenize_and_the_models_listing_know_the_images(
    client: openai.OpenAI, daemon: DaemonProcess
) -> None:
    message = image_message(data_url(picture(11)), data_url(picture(12)))
    usage = ask(client, message).usage
    assert usage is not None
    tokens = httpx.post(
        f"{daemon.base_url}/tokenize", json={"model": MODEL, "messages": [message]}, timeout=60
    ).json()
    assert tokens["count"] == usage.prompt_tokens == len(tokens["tokens"])
    # Image placeholders are shown as the image token: every id is in the vocabulary.
    back = httpx.post(
        f"{daemon.base_url}/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}
    )
    assert back.status_code == 200, back.text
    assert "<image>" in back.json()["prompt"]
    command = [sys.executable, "-m", "vllm_mlx.cli", "models", "--json"]
    listed = subprocess.run(
        [*command, "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(listed.stdout[listed.stdout.index("[") :])}
    assert rows[MODEL]["vision"] is True
    assert rows["smol"]["vision"] is False


def test_metrics_count_images_and_encodes(daemon: DaemonProcess, client: openai.OpenAI) -> None:
    before = scrape(daemon)
    ask(client, image_message(data_url(picture(9)), data_url(picture(10))))
    after = scrape(daemon)
    assert (
        value(after, "vllm_mlx_images_total", model_name=MODEL)
        - value(before, "vllm_mlx_images_total", model_name=MODEL)
        == 2
    )
    assert value(after, "vllm_mlx_image_bytes_total", model_name=MODEL) > value(
        before, "vllm_mlx_image_bytes_total", model_name=MODEL
    )
    encodes = "vllm_mlx_vision_encode_seconds_count"
    assert value(after, encodes, model_name=MODEL) == value(before, encodes, model_name=MODEL) + 1
    assert httpx.get(f"{daemon.base_url}/health").status_code == 200
