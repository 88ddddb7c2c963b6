"""The one id minter: every response, message and item id the daemon hands out."""

from __future__ import annotations

import secrets


def new_id(prefix: str, hex_digits: int = 24) -> str:
    """`prefix` (with its protocol's separator: "chatcmpl-", "msg_") and random hex.

    OpenAI chat and completion ids and Anthropic message ids carry 24 hex digits, the
    Responses API's 32, as the hosted APIs' do.
    """
    return prefix + secrets.token_hex((hex_digits + 1) // 2)[:hex_digits]
