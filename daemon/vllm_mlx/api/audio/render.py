"""mlx-whisper's result (text, segments, words) as each OpenAI response format."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from vllm_mlx.api.audio.schema import (
    DurationUsage,
    TextDeltaEvent,
    TextDoneEvent,
    TokenUsage,
    TranscriptionJson,
    TranscriptionSegment,
    TranscriptionVerbose,
    TranscriptionWord,
)

AUDIO_TOKENS_PER_SECOND = 50  # Whisper's encoder: 1500 positions per 30 s window


def full_text(result: dict[str, Any]) -> str:
    return str(result.get("text", "")).strip()


def duration_usage(seconds: float) -> DurationUsage:
    return {"type": "duration", "seconds": float(math.ceil(seconds))}  # billed as OpenAI does


def token_usage(result: dict[str, Any], seconds: float) -> TokenUsage:
    audio = round(seconds * AUDIO_TOKENS_PER_SECOND)
    output = sum(len(s.get("tokens", [])) for s in result.get("segments", []))
    return {
        "type": "tokens",
        "input_tokens": audio,
        "input_token_details": {"text_tokens": 0, "audio_tokens": audio},
        "output_tokens": output,
        "total_tokens": audio + output,
    }


def as_json(result: dict[str, Any], seconds: float) -> TranscriptionJson:
    return {"text": full_text(result), "usage": duration_usage(seconds)}


def _segments(result: dict[str, Any]) -> list[TranscriptionSegment]:
    return [
        {
            "id": int(s["id"]),
            "seek": int(s["seek"]),
            "start": round(float(s["start"]), 3),
            "end": round(float(s["end"]), 3),
            "text": str(s["text"]),
            "tokens": [int(t) for t in s["tokens"]],
            "temperature": float(s["temperature"]),
            "avg_logprob": float(s["avg_logprob"]),
            "compression_ratio": float(s["compression_ratio"]),
            "no_speech_prob": float(s["no_speech_prob"]),
        }
        for s in result.get("segments", [])
        if str(s.get("text", "")).strip()
    ]


def _words(result: dict[str, Any]) -> list[TranscriptionWord]:
    return [
        {
            "word": str(w["word"]).strip(),
            "start": round(float(w["start"]), 3),
            "end": round(float(w["end"]), 3),
        }
        for s in result.get("segments", [])
        for w in s.get("words", [])
    ]


def as_verbose(
    result: dict[str, Any], seconds: float, task: str, language: str, granularities: set[str]
) -> TranscriptionVerbose:
    body: TranscriptionVerbose = {
        "task": task,
        "language": language,
        "duration": round(seconds, 3),
        "text": full_text(result),
        "usage": duration_usage(seconds),
    }
    if "segment" in granularities or not granularities:
        body["segments"] = _segments(result)
    if "word" in granularities:
        body["words"] = _words(result)
    return body


def _clock(seconds: float, separator: str) -> str:
    millis = round(max(seconds, 0.0) * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def as_srt(result: dict[str, Any]) -> str:
    cues = [
        f"{n}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{s['text'].strip()}\n"
        for n, s in enumerate(_segments(result), start=1)
    ]
    return "\n".join(cues)


def as_vtt(result: dict[str, Any]) -> str:
    cues = [
        f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{s['text'].strip()}\n"
        for s in _segments(result)
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


def as_text(result: dict[str, Any]) -> str:
    return full_text(result) + "\n"


def stream_events(
    result: dict[str, Any], seconds: float
) -> Iterator[TextDeltaEvent | TextDoneEvent]:
    """One delta per segment (the first with its leading space dropped), then done."""
    first = True
    for segment in _segments(result):
        text = segment["text"].lstrip() if first else segment["text"]
        first = False
        yield {"type": "transcript.text.delta", "delta": text}
    yield {
        "type": "transcript.text.done",
        "text": full_text(result),
        "usage": token_usage(result, seconds),
    }
