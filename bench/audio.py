"""Speech to text: the bundled Whisper tiny.en's real-time factor, in this process.

    python bench/audio.py            # ~2 minutes on 2 cores (needs espeak-ng)

The model is loaded as the daemon loads it (`task: transcribe`: the CTranslate2 import,
float32 on the CPU) and run through the same call the speech engine makes. The audio is
the e2e test's: ten espeak-ng sentences joined by a second of silence (~36 s, two 30 s
windows), and the first sentence alone (~2 s, one window). Each case is the median of
three rounds after a warm-up, with the encoder's softmax in MLX and in the CPU kernel
(models/cpu/whisper_attention.py), rounds alternating. The real-time factor (RTF) is
seconds of audio per second of compute: above 1 transcribes faster than the sound
plays. Prints a markdown table.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROUNDS = 3
SENTENCES = [
    "The weather is nice today.",
    "Please open the window before you leave.",
    "I would like a cup of hot coffee.",
    "My brother lives in a small house near the river.",
    "We are going to the market on Saturday morning.",
    "She reads a book every night before bed.",
    "The train arrives at seven o'clock.",
    "Can you tell me where the station is?",
    "The children played in the park all afternoon.",
    "Thank you very much for your help.",
]


def spoken(root: Path) -> list[Any]:
    from vllm_mlx.api.audio.decode import decode_audio

    samples = []
    for n, text in enumerate(SENTENCES):
        path = root / f"{n}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), text], check=True)
        samples.append(decode_audio(path.read_bytes(), 60).samples)
    return samples


def kernel_switch(whisper: Any) -> Any:
    """A function turning the encoder's CPU softmax route (models/cpu/whisper_attention.py)
    off and on again, to time both in one run."""
    blocks = list(whisper.encoder.blocks)
    routed = [b.attn.__dict__.get("qkv_attention") for b in blocks]

    def use(on: bool) -> None:
        for block, function in zip(blocks, routed, strict=True):
            if function is None:
                continue  # not routed (no kernel): both columns measure MLX's softmax
            if on:
                object.__setattr__(block.attn, "qkv_attention", function)
            elif "qkv_attention" in block.attn.__dict__:
                object.__delattr__(block.attn, "qkv_attention")

    return use


def median_seconds(loaded: Any, audio: Any, options: Any, use: Any) -> tuple[float, float]:
    """Median seconds with MLX's softmax and with the kernel's, rounds alternating."""
    from vllm_mlx.models.speech import transcribe

    transcribe(loaded, audio, options)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(ROUNDS):
        for on in (False, True):
            use(on)
            start = time.perf_counter()
            transcribe(loaded, audio, options)
            times[on].append(time.perf_counter() - start)
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> None:
    import numpy as np

    from bench.machine import describe
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.cpu import blas
    from vllm_mlx.models.loader import load_model
    from vllm_mlx.models.speech import LoadedSpeechModel, SpeechOptions

    chosen = blas.configure("auto")
    print(describe(str(chosen)))
    with tempfile.TemporaryDirectory() as tmp:
        parts = spoken(Path(tmp))
        silence = np.zeros(16_000, np.float32)
        long = np.concatenate([p for s in parts for p in (s, silence)])
        settings = ModelSettings(name="w", source="builtin:whisper-tiny-en", task="transcribe")
        started = time.perf_counter()
        loaded = load_model(settings, Path(tmp) / "cache")
        assert isinstance(loaded, LoadedSpeechModel)
        print(f"\nfirst load (CTranslate2 import + load): {time.perf_counter() - started:.2f} s\n")
        cases = [
            ("one sentence", parts[0], SpeechOptions()),
            ("ten sentences (2 windows)", long, SpeechOptions()),
            ("ten sentences, word timestamps", long, SpeechOptions(word_timestamps=True)),
        ]
        use = kernel_switch(loaded.model)
        print("| audio | seconds of audio | MLX softmax: s (RTF) | kernel: s (RTF) | speed-up |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, audio, options in cases:
            seconds = len(audio) / 16_000
            plain, kernel = median_seconds(loaded, audio, options, use)
            row = (
                f"| {name} | {seconds:.1f} | {plain:.2f} ({seconds / plain:.1f}x) | "
                f"{kernel:.2f} ({seconds / kernel:.1f}x) | {plain / kernel:.2f}x |"
            )
            print(row, flush=True)


if __name__ == "__main__":
    main()
