"""Uploaded audio to what Whisper hears: mono float32 samples at 16 kHz.

PyAV (FFmpeg's libraries, bundled in its wheels: no system package) reads any container
and codec FFmpeg knows: wav, mp3, m4a/aac, flac, ogg/vorbis/opus, webm. Decoding is
bounded twice: the caller checks the file's size (limits.max_audio_mb) before calling,
and decoding stops as soon as the sound runs past `max_seconds`
(limits.max_audio_seconds), so a small file that expands to hours is never held whole.
Blocking: run it in a worker thread.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000


class AudioDecodeError(ValueError):
    """The upload is not decodable audio, or too long; the message says which."""

    def __init__(self, message: str, code: str = "invalid_audio") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32, mono, 16 kHz
    container: str

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def decode_audio(data: bytes, max_seconds: float) -> DecodedAudio:
    """The upload's first audio stream as mono float32 at 16 kHz."""
    import av

    if not data:
        raise AudioDecodeError("the uploaded file is empty", "empty_file")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise AudioDecodeError(f"the file is not audio FFmpeg can read ({exc})") from exc
    with container:
        streams = container.streams.audio
        if not streams:
            kind = container.format.name
            raise AudioDecodeError(f"the file ({kind}) holds no audio stream", "no_audio")
        limit = int(max_seconds * SAMPLE_RATE)
        chunks: list[np.ndarray] = []
        total = 0
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        try:
            for frame in container.decode(streams[0]):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                    total += chunks[-1].size
                if total > limit:
                    raise AudioDecodeError(
                        f"the audio is longer than limits.max_audio_seconds ({max_seconds:g} s)",
                        "audio_too_long",
                    )
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
        except av.FFmpegError as exc:
            raise AudioDecodeError(f"the audio stream is corrupt ({exc})") from exc
        name = container.format.name
    samples = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0)
    if samples.size == 0:
        raise AudioDecodeError("the file holds no audio samples (0 seconds)", "empty_audio")
    if samples.size > limit:
        raise AudioDecodeError(
            f"the audio is longer than limits.max_audio_seconds ({max_seconds:g} s)",
            "audio_too_long",
        )
    return DecodedAudio(np.ascontiguousarray(samples, dtype=np.float32), name)
