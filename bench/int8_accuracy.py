"""What `int8_activations: true` changes in the bundled model's predictions.

    python bench/int8_accuracy.py [--prompts 16] [--tokens 64]

For each prompt (a chat about one of bench/prompts.TOPICS), the exact kernel path decodes
greedily; the same token sequence is then fed (teacher forcing) through the int8 path, and
per position the two next-token distributions are compared: top-1 agreement, KL(exact ||
int8) and the largest |log p| difference. Then both paths decode freely: how many prompts
give the same greedy text, and where the others first differ. Prints markdown.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx

from bench.prompts import TOPICS
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.cpu import blas, qmm
from vllm_mlx.models.loader import load_model


def set_int8(model: Any, on: bool) -> None:
    for _, module in model.named_modules():
        if isinstance(module, qmm.KernelQuantizedLinear | qmm.KernelQuantizedEmbedding):
            module.int8_activations = on


def log_probs(model: Any, tokens: list[int]) -> mx.array:
    logits = model(mx.array([tokens]))[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def greedy(model: Any, prompt: list[int], count: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(count):  # whole-sequence passes: no cache, the same arithmetic per row
        tokens.append(int(mx.argmax(model(mx.array([tokens]))[0, -1]).item()))
    return tokens[len(prompt) :]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    blas.configure()
    settings = ModelSettings(name="m", source="builtin:smollm2-135m-instruct")
    loaded = load_model(settings, Path(tempfile.mkdtemp(prefix="vllm-mlx-int8-")))
    model, tokenizer = loaded.model, loaded.tokenizer
    if not qmm.extension().int8_available():
        print("this CPU does not grant AVX-512 VNNI: nothing to compare")
        return 1
    agree = total = same_text = 0
    kls: list[float] = []
    worst = 0.0
    first_diffs: list[int] = []
    for topic in TOPICS[: args.prompts]:
        messages = [{"role": "user", "content": f"Write a short paragraph about {topic}."}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        set_int8(model, False)
        exact_text = greedy(model, prompt, args.tokens)
        sequence = prompt + exact_text
        exact = log_probs(model, sequence)[len(prompt) - 1 : -1]
        set_int8(model, True)
        int8 = log_probs(model, sequence)[len(prompt) - 1 : -1]
        agree += int(mx.sum(mx.argmax(exact, -1) == mx.argmax(int8, -1)).item())
        total += exact.shape[0]
        kls.append(float(mx.mean(mx.sum(mx.exp(exact) * (exact - int8), -1)).item()))
        worst = max(worst, float(mx.max(mx.abs(exact - int8)).item()))
        int8_text = greedy(model, prompt, args.tokens)
        if int8_text == exact_text:
            same_text += 1
        else:
            first_diffs.append(
                next(
                    i for i, (a, b) in enumerate(zip(exact_text, int8_text, strict=True)) if a != b
                )
            )
    print("| prompts | positions | top-1 agreement | mean KL (nats) | max abs log p diff |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    kl = sum(kls) / len(kls)
    print(f"| {args.prompts} | {total} | {agree / total:.2%} | {kl:.5f} | {worst:.3f} |")
    print(f"\n- greedy {args.tokens}-token texts identical: {same_text} of {args.prompts}")
    if first_diffs:
        print(f"- first differing token of the others: {sorted(first_diffs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
