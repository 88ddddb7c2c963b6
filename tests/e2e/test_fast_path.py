"""The default daemon on Linux takes the fast CPU path: the quantized kernel install.sh
builds (float32 weights on OpenBLAS when it is missing: see tests/unit/test_qmm_kernel.py)."""

from __future__ import annotations

import ctypes
import json
import sys

import httpx
import pytest

from tests.conftest import StartDaemon


def openblas_installed() -> bool:
    try:
        ctypes.CDLL("libopenblas.so.0")
    except OSError:
        return False
    return True


def model_loaded_line(log: str) -> dict[str, object]:
    for line in log.splitlines():
        if line.startswith("{") and '"model loaded"' in line:
            record: dict[str, object] = json.loads(line)
            return record
    raise AssertionError(f"no 'model loaded' line in:\n{log[-3000:]}")


@pytest.mark.skipif(sys.platform != "linux", reason="the Linux CPU backend")
@pytest.mark.skipif(not openblas_installed(), reason="OpenBLAS is not installed")
def test_default_config_serves_the_quantized_kernel(start_daemon: StartDaemon) -> None:
    daemon = start_daemon()
    record = model_loaded_line(daemon.log_text())
    # "openblas (Cooperlake)": the library, and the kernels it runs on this CPU.
    assert str(record["blas"]).startswith("openblas (") and "OpenBLAS core" in str(
        record["blas_reason"]
    ), record
    assert record["dtype"] == "quantized" and record["path"] == "quantized+kernel", record
    reply = httpx.post(
        f"{daemon.base_url}/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=120,
    )
    assert reply.status_code == 200
    assert reply.json()["usage"]["completion_tokens"] > 0


def test_dtype_quantized_keeps_the_stored_weights(start_daemon: StartDaemon) -> None:
    daemon = start_daemon(
        {
            "models": [
                {"name": "smol", "source": "builtin:smollm2-135m-instruct", "dtype": "quantized"}
            ]
        }
    )
    record = model_loaded_line(daemon.log_text())
    assert record["dtype"] == "quantized"


@pytest.mark.skipif(sys.platform != "linux", reason="the Linux CPU kernel")
def test_int8_activations_serve_and_a_request_replies_alike_alone_or_batched(
    start_daemon: StartDaemon,
) -> None:
    """`int8_activations: true` through config, loader and daemon: the load line names the
    path (or why it is ignored on a CPU without VNNI), and through the OpenAI SDK a greedy
    request gets the same reply alone as beside three others (the int8 tiles give a row
    the same bits in any batch)."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from vllm_mlx.models.cpu import qmm

    daemon = start_daemon(
        {
            "models": [
                {
                    "name": "smol",
                    "source": "builtin:smollm2-135m-instruct",
                    "int8_activations": True,
                }
            ]
        }
    )
    record = model_loaded_line(daemon.log_text())
    granted = qmm.status().available and bool(qmm.extension().int8_available())
    if granted:
        assert record["path"] == "quantized+kernel+int8", record
    else:
        assert "int8_activations ignored" in str(record["dtype_reason"]), record
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", timeout=120)

    def ask(topic: str) -> str:
        reply = client.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": f"Write two sentences about {topic}."}],
            max_tokens=24,
            temperature=0,
        )
        return reply.choices[0].message.content or ""

    ask("the sea")  # so that both compared requests start from the same prefix-cache hit
    alone = ask("the sea")
    with ThreadPoolExecutor(4) as pool:
        batched = list(pool.map(ask, ["the sea", "a forest", "the moon", "bread"]))
    assert alone and batched[0] == alone
