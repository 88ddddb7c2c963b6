"""Raw logprobs keep the logits from before the other processors, even those that assign
into the array they are given (mlx-lm's repetition and presence penalties)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors

from vllm_mlx.engine.logprobs import RawCapture


def test_a_penalty_after_the_capture_does_not_change_what_it_kept() -> None:
    capture = RawCapture()
    (penalty,) = make_logits_processors(repetition_penalty=2.0)
    logits = mx.array([[1.0, 2.0, 3.0, 4.0]])
    want = [x - 4.440189698561196 for x in (1.0, 2.0, 3.0, 4.0)]  # log-softmax, untouched
    history = mx.array([1, 3])
    penalized = penalty(history, capture(history, logits))
    assert penalized[0, 3].item() == 2.0  # the penalty did apply downstream
    assert mx.allclose(capture.pop(), mx.array(want), atol=1e-5).item()
