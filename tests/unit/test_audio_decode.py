"""Uploaded audio decoded to Whisper's input (api/audio/decode.py), and the response
formats rendered from mlx-whisper's result (api/audio/render.py).

Every container the API names is encoded here with PyAV's own encoders from one known
signal (a 440 Hz tone, 1.5 s at 22.05 kHz stereo), then decoded back: the length must
come out at 1.5 s at 16 kHz within a codec frame, and the tone must survive.
"""

from __future__ import annotations

import io
import wave

import av
import numpy as np
import pytest

from vllm_mlx.api.audio.decode import SAMPLE_RATE, AudioDecodeError, decode_audio
from vllm_mlx.api.audio.render import as_srt, as_verbose, as_vtt, stream_events

RATE, SECONDS = 22_050, 1.5
CODEC_SLACK_S = 0.1  # encoder delay / padding frames (aac, opus, mp3)
CONTAINERS = [
    ("wav", "pcm_s16le"),
    ("mp3", "libmp3lame"),
    ("ipod", "aac"),  # .m4a
    ("flac", "flac"),
    ("ogg", "vorbis"),
    ("webm", "libopus"),
]


def encoded(container: str, codec: str, seconds: float = SECONDS) -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    rate = 48_000 if codec == "libopus" else RATE
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="stereo")
        stream.codec_context.options = {"strict": "experimental"}  # FFmpeg's own vorbis
        resampler = av.AudioResampler(format=stream.format.name, layout="stereo", rate=rate)
        interleaved = np.stack([tone, tone], axis=1).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(interleaved, "flt", "stereo")
        frame.sample_rate = RATE
        for part in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(part):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def silent_wav() -> bytes:
    """A valid WAV header and no samples: 0 seconds."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
    return buffer.getvalue()


@pytest.mark.parametrize(("container", "codec"), CONTAINERS)
def test_every_container_decodes(container: str, codec: str) -> None:
    audio = decode_audio(encoded(container, codec), max_seconds=60)
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert abs(audio.seconds - SECONDS) < CODEC_SLACK_S, audio.seconds
    middle = audio.samples[SAMPLE_RATE // 4 : SAMPLE_RATE]
    spectrum = np.abs(np.fft.rfft(middle))
    peak_hz = np.argmax(spectrum) * SAMPLE_RATE / len(middle)
    assert abs(peak_hz - 440) < 5  # resampled to 16 kHz, still the same tone


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "empty_file"),
        (b"this is not audio at all " * 40, "invalid_audio"),
        (silent_wav(), "empty_audio"),
    ],
)
def test_bad_files(data: bytes, code: str) -> None:
    with pytest.raises(AudioDecodeError) as caught:
        decode_audio(data, max_seconds=60)
    assert caught.value.code == code


def test_too_long_stops_decoding() -> None:
    with pytest.raises(AudioDecodeError, match="max_audio_seconds") as caught:
        decode_audio(encoded("flac", "flac"), max_seconds=1.0)
    assert caught.value.code == "audio_too_long"


RESULT = {
    "text": " Hello there. General Kenobi.",
    "segments": [
        {"id": 0, "seek": 0, "start": 0.0, "end": 1.5, "text": " Hello there.",
         "tokens": [1, 2, 3], "temperature": 0.0, "avg_logprob": -0.2,
         "compression_ratio": 1.1, "no_speech_prob": 0.01,
         "words": [{"word": " Hello", "start": 0.0, "end": 0.6, "probability": 0.9},
                   {"word": " there.", "start": 0.6, "end": 1.5, "probability": 0.9}]},
        {"id": 1, "seek": 0, "start": 3661.25, "end": 3662.0, "text": " General Kenobi.",
         "tokens": [4, 5], "temperature": 0.0, "avg_logprob": -0.3,
         "compression_ratio": 1.0, "no_speech_prob": 0.02, "words": []},
    ],
}  # fmt: skip


def test_subtitles() -> None:
    assert as_srt(RESULT) == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
        "2\n01:01:01,250 --> 01:01:02,000\nGeneral Kenobi.\n"
    )
    assert as_vtt(RESULT) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
        "01:01:01.250 --> 01:01:02.000\nGeneral Kenobi.\n"
    )


def test_verbose_and_stream() -> None:
    body = as_verbose(RESULT, 3662.4, "transcribe", "english", {"word", "segment"})
    assert body["text"] == "Hello there. General Kenobi." and body["duration"] == 3662.4
    assert body["usage"] == {"type": "duration", "seconds": 3663.0}
    assert [s["text"] for s in body["segments"]] == [" Hello there.", " General Kenobi."]
    assert body["words"] == [
        {"word": "Hello", "start": 0.0, "end": 0.6},
        {"word": "there.", "start": 0.6, "end": 1.5},
    ]
    assert "words" not in as_verbose(RESULT, 1.0, "transcribe", "english", set())
    events = list(stream_events(RESULT, 2.0))
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    assert "".join(deltas) == "Hello there. General Kenobi."
    done = events[-1]
    assert done["type"] == "transcript.text.done" and done["text"] == "Hello there. General Kenobi."
    assert done["usage"]["output_tokens"] == 5 and done["usage"]["input_tokens"] == 100
