"""POST /v1/audio/transcriptions and /v1/audio/translations (OpenAI's multipart shapes).

Every field is checked before the audio is decoded, and the file's size
(limits.max_audio_mb) before it is decoded; decoding runs in a worker thread, bounded by
limits.max_audio_seconds, and inference on the model's own engine thread.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import structlog
from litestar import Request, Response, Router, post
from litestar.datastructures import UploadFile
from litestar.response import Stream

from vllm_mlx.api.audio.decode import AudioDecodeError, DecodedAudio, decode_audio
from vllm_mlx.api.audio.render import (
    as_json,
    as_srt,
    as_text,
    as_verbose,
    as_vtt,
    stream_events,
)
from vllm_mlx.api.audio.schema import GRANULARITIES, RESPONSE_FORMATS
from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.acquire import acquire, served_entry
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.offload import in_worker
from vllm_mlx.api.sse import SSE_HEADERS, data_event
from vllm_mlx.api.state import ServerState, note_model, request_settings, server_state
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.speech_runner import SpeechEngine
from vllm_mlx.models.speech import SpeechOptions
from vllm_mlx.usage.record import add_usage

log = structlog.get_logger("vllm_mlx.requests")

MIB = 2**20
LANGUAGE_NAMES = {"en": "english"}  # verbose_json names the language; others say the code


@dataclass(frozen=True)
class AudioRequest:
    model: str
    data: bytes
    response_format: str
    options: SpeechOptions
    granularities: set[str]
    stream: bool


def _text_field(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a text field, not a file", name)
    return value


def _temperature(form: Any) -> float | None:
    raw = _text_field(form, "temperature")
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        message = f"'temperature' is {raw!r}; send a number from 0 to 1"
        raise bad_request(message, "temperature") from None
    if not 0.0 <= value <= 1.0:
        raise bad_request(f"'temperature' is {value:g}; it must be from 0 to 1", "temperature")
    return value


def _flag(form: Any, name: str) -> bool:
    raw = (_text_field(form, name) or "false").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise bad_request(f"'{name}' is {raw!r}; send true or false", name)
    return raw in ("true", "1")


def _granularities(form: Any, response_format: str) -> set[str]:
    values = [*form.getall("timestamp_granularities[]", []),
              *form.getall("timestamp_granularities", [])]  # fmt: skip
    wanted = {str(v) for v in values}
    unknown = wanted - set(GRANULARITIES)
    if unknown:
        raise bad_request(
            f"'timestamp_granularities' has {sorted(unknown)}; each must be word or segment",
            "timestamp_granularities",
        )
    if wanted and response_format != "verbose_json":
        raise bad_request(
            "'timestamp_granularities' needs response_format verbose_json",
            "timestamp_granularities",
        )
    return wanted


async def _read_form(request: Request[Any, Any, Any], settings: Settings) -> tuple[Any, bytes]:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise bad_request(
            "send the audio as multipart/form-data (fields: file, model, ...)", "file"
        )
    try:
        form = await request.form()
    except Exception as exc:  # Litestar's parser: a malformed multipart body
        raise bad_request(f"the multipart body cannot be read ({exc})", "file") from exc
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("'file' is missing: send the audio as the multipart field 'file'", "file")
    limit = settings.limits.max_audio_mb
    data = await upload.read()
    if len(data) > limit * MIB:
        raise APIError(
            413,
            f"the audio file is {len(data) / MIB:.1f} MiB, more than limits.max_audio_mb "
            f"({limit:g} MiB)",
            "too_large",
            "file",
            "file_too_large",
        )
    return form, data


async def parse_audio_request(
    request: Request[Any, Any, Any], settings: Settings, task: str
) -> AudioRequest:
    form, data = await _read_form(request, settings)
    model = _text_field(form, "model")
    if not model:
        raise bad_request("'model' is missing", "model")
    response_format = _text_field(form, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise bad_request(
            f"'response_format' is {response_format!r}; one of {', '.join(RESPONSE_FORMATS)}",
            "response_format",
        )
    stream = _flag(form, "stream")
    if stream and (task != "transcribe" or response_format not in ("json", "text")):
        raise bad_request(
            "'stream' is for transcriptions with response_format json or text", "stream"
        )
    language = _text_field(form, "language") if task == "transcribe" else None
    options = SpeechOptions(
        task=task,
        language=language.strip().lower() or None if language else None,
        prompt=_text_field(form, "prompt") or None,
        temperature=_temperature(form),
        word_timestamps=False,
    )
    granularities = _granularities(form, response_format)
    if "word" in granularities:
        options = SpeechOptions(**{**options.__dict__, "word_timestamps": True})
    return AudioRequest(model, data, response_format, options, granularities, stream)


async def resolve_transcriber(state: ServerState, body: AudioRequest) -> SpeechEngine:
    """The `task: transcribe` model named, checked against what it can do, held."""
    entry = served_entry(state, body.model)
    if entry.settings.task != "transcribe":
        served = [e.settings.name for e in state.registry.entries()
                  if e.settings.task == "transcribe"]  # fmt: skip
        hint = f" (speech models: {', '.join(served)})" if served else ""
        raise bad_request(
            f"model '{body.model}' is a {entry.settings.task} model, not a speech-to-text "
            f"one (task: transcribe){hint}",
            "model",
            "model_not_transcriber",
        )
    await acquire(state, entry, body.model)
    engine = entry.transcriber
    assert engine is not None  # acquire: running, and a speech model's runner
    loaded = engine.loaded
    if body.options.task == "translate" and not loaded.multilingual:
        raise bad_request(
            f"model '{body.model}' is English-only and cannot translate; translations need "
            "a multilingual Whisper model",
            "model",
            "translation_unsupported",
        )
    language = body.options.language
    if language is not None and language not in loaded.languages:
        only = " (it is English-only: send 'en' or no language)" if not loaded.multilingual else ""
        raise bad_request(
            f"'language' is {language!r}: model '{body.model}' does not know it{only}; send "
            "an ISO-639-1 code",
            "language",
            "unsupported_language",
        )
    return engine


async def _decoded(data: bytes, settings: Settings) -> DecodedAudio:
    try:
        async with asyncio.timeout(settings.server.timeout):
            return await in_worker(decode_audio, data, settings.limits.max_audio_seconds)
    except AudioDecodeError as exc:
        raise bad_request(str(exc), "file", exc.code) from exc


def _render(body: AudioRequest, result: dict[str, Any], seconds: float) -> Response[Any]:
    fmt = body.response_format
    if fmt == "text":
        return Response(as_text(result), media_type="text/plain")
    if fmt == "srt":
        return Response(as_srt(result), media_type="text/plain")
    if fmt == "vtt":
        return Response(as_vtt(result), media_type="text/vtt")
    if fmt == "verbose_json":
        language = str(result.get("language") or "en")
        name = LANGUAGE_NAMES.get(language, language)
        task = body.options.task
        return Response(as_verbose(result, seconds, task, name, body.granularities))
    return Response(as_json(result, seconds))


async def _audio(request: Request[Any, Any, Any], task: str, route: str) -> Response[Any]:
    started = time.monotonic()
    settings = request_settings(request)
    body = await parse_audio_request(request, settings, task)
    state = server_state(request)
    engine = await resolve_transcriber(state, body)
    note_model(request.scope, body.model)
    audio = await _decoded(body.data, settings)
    result = await engine.transcribe(audio.samples, body.options, started + settings.server.timeout)
    duration = time.monotonic() - started
    state.metrics.audio_request(engine.loaded.name, audio.seconds)
    add_usage(0, 0, 0, duration)
    log.info("request", request_id=new_id("audio-"), route=route, model=body.model, status=200,
             audio_seconds=round(audio.seconds, 2), format=body.response_format,
             stream=body.stream, duration_s=round(duration, 4))  # fmt: skip
    if body.stream:
        events = [data_event(event) for event in stream_events(result, audio.seconds)]
        return Stream(iter(events), media_type="text/event-stream", headers=SSE_HEADERS)
    return _render(body, result, audio.seconds)


@post("/v1/audio/transcriptions", status_code=200)
async def transcriptions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _audio(request, "transcribe", "/v1/audio/transcriptions")


@post("/v1/audio/translations", status_code=200)
async def translations(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _audio(request, "translate", "/v1/audio/translations")


def make_audio_router() -> Router:
    return Router(
        path="/",
        route_handlers=[transcriptions, translations],
        exception_handlers={Exception: openai_error_response},
    )
