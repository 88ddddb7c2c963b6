"""OpenAI's audio transcription and translation shapes (the wire types, nothing else).

The request is multipart/form-data, read field by field in routes.py; these are the
response bodies and stream events (openai-openapi.yaml: CreateTranscriptionResponseJson,
...VerboseJson, TranscriptionSegment, TranscriptionWord, TranscriptTextDeltaEvent,
TranscriptTextDoneEvent).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
RESPONSE_FORMATS: tuple[str, ...] = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES: tuple[str, ...] = ("word", "segment")


class DurationUsage(TypedDict):
    type: Literal["duration"]
    seconds: float


class InputTokenDetails(TypedDict):
    text_tokens: int
    audio_tokens: int


class TokenUsage(TypedDict):
    type: Literal["tokens"]
    input_tokens: int
    input_token_details: InputTokenDetails
    output_tokens: int
    total_tokens: int


class TranscriptionWord(TypedDict):
    word: str
    start: float
    end: float


class TranscriptionSegment(TypedDict):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptionJson(TypedDict):
    text: str
    usage: DurationUsage


class TranscriptionVerbose(TypedDict):
    task: str
    language: str
    duration: float
    text: str
    segments: NotRequired[list[TranscriptionSegment]]
    words: NotRequired[list[TranscriptionWord]]
    usage: DurationUsage


class TextDeltaEvent(TypedDict):
    type: Literal["transcript.text.delta"]
    delta: str


class TextDoneEvent(TypedDict):
    type: Literal["transcript.text.done"]
    text: str
    usage: TokenUsage
