"""References for the Whisper import, run in a fresh process (so OpenBLAS is loaded
before mlx, as in the daemon: the reference BLAS would take ~10x longer).

  python -m tests.support.whisper_reference encoder CT2_DIR MLX_DIR AUDIO
      CTranslate2's encoder output and greedy tokens against the imported model's
  python -m tests.support.whisper_reference transcribe MLX_DIR AUDIO
      mlx-whisper's own `transcribe` on the array the daemon decodes from AUDIO

Each prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vllm_mlx.models.cpu import blas

blas.configure("auto")

import numpy as np  # noqa: E402

from vllm_mlx.api.audio.decode import decode_audio  # noqa: E402
from vllm_mlx.models.cpu.whisper_attention import route_encoder_attention  # noqa: E402

SOT_NO_TIMESTAMPS = [50257, 50362]  # tiny.en: <|startoftranscript|> <|notimestamps|>


def _samples(path: str) -> Any:
    return decode_audio(Path(path).read_bytes(), 3600).samples


def encoder(ct2_dir: str, mlx_dir: str, audio: str) -> dict[str, Any]:
    import ctranslate2
    import mlx.core as mx
    from mlx_whisper.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
    from mlx_whisper.decoding import DecodingOptions
    from mlx_whisper.load_models import load_model

    model = load_model(mlx_dir, dtype=mx.float32)
    mel = pad_or_trim(log_mel_spectrogram(_samples(audio), 80), N_FRAMES, axis=-2)
    ours = np.array(model.encoder(mel[None].astype(mx.float32)))
    # The daemon's CPU route of the encoder's softmax (models/cpu/whisper_attention.py),
    # on the same model and window, against mlx-whisper's own just above.
    routed = route_encoder_attention(model)
    kernel = np.array(model.encoder(mel[None].astype(mx.float32))) if routed else ours
    reference = ctranslate2.models.Whisper(ct2_dir, device="cpu", compute_type="float32")
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.array(mel).T[None]))
    theirs = np.array(reference.encode(features, to_cpu=True))
    generated = reference.generate(features, [SOT_NO_TIMESTAMPS], beam_size=1)
    options = DecodingOptions(language="en", without_timestamps=True, fp16=False)
    decoded = model.decode(mel.astype(mx.float32), options)
    eot = 50256
    return {
        "max_abs": float(np.abs(ours - theirs).max()),
        "kernel_routed": routed,
        "kernel_max_abs": float(np.abs(kernel - ours).max()),
        "scale": float(np.abs(theirs).max()),
        "ct2_tokens": [t for t in generated[0].sequences_ids[0] if t < eot],
        "mlx_tokens": [t for t in decoded.tokens if t < eot],
    }


def transcribe(mlx_dir: str, audio: str) -> dict[str, Any]:
    import mlx_whisper

    result = mlx_whisper.transcribe(_samples(audio), path_or_hf_repo=mlx_dir, fp16=False)
    return {"text": result["text"]}


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    print(json.dumps(encoder(*args) if command == "encoder" else transcribe(*args)))
