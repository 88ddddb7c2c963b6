"""The `auth` section: API keys, the scopes and models each may use, and rate limits.

Two spellings of keys. `api_keys` (a flat list of secrets) stays as it always was:
each key may do everything. `keys` names each key and says what it may do; its secret
is never in the file as such: `key_sha256` (the hex SHA-256 of the key, what
`vllm-mlx keys new` prints), `key_env` (an environment variable holding it) or
`key_file` (a file only its owner can read). Each key is turned into its digest once,
when the settings are built, and the edge compares digests only.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import PrivateAttr, field_validator, model_validator

from vllm_mlx.config.fields import LocatedError, Reload, Section, setting

Scope = Literal["inference", "models", "mcp", "admin"]
SCOPES: tuple[Scope, ...] = ("inference", "models", "mcp", "admin")
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _usable_secret(key: str, where: str) -> str:
    if not key or key != key.strip() or any(c.isspace() for c in key):
        raise ValueError(f"{where} must be non-empty and contain no whitespace")
    return key


class KeyRateLimit(Section):
    requests_per_minute: int | None = setting(
        None,
        Reload.HOT,
        "Requests per minute this key may make; unset: `auth.rate_limit`; 0: unlimited.",
        ge=0,
    )
    tokens_per_minute: int | None = setting(
        None,
        Reload.HOT,
        "Prompt + completion tokens per minute this key may spend; unset or 0: no limit. "
        "A request is admitted while the key is under the limit and its tokens are "
        "counted when it ends, so one large request may overdraw the minute.",
        ge=0,
    )


class KeyQuota(Section):
    tokens_per_day: int | None = setting(
        None,
        Reload.HOT,
        "Prompt + completion tokens this key may spend per UTC day (resets 00:00 UTC); "
        "unset: no quota. Needs `usage.enabled`.",
        ge=1,
    )
    tokens_per_month: int | None = setting(
        None,
        Reload.HOT,
        "Prompt + completion tokens per calendar month (UTC); unset: no quota.",
        ge=1,
    )

    @property
    def limited(self) -> bool:
        return self.tokens_per_day is not None or self.tokens_per_month is not None


class NamedKey(Section):
    name: str = setting(..., Reload.HOT, "The key's name: in logs and /v1/status, never the key.")
    key_sha256: str | None = setting(None, Reload.HOT, "Hex SHA-256 of the key.")
    key_env: str | None = setting(None, Reload.HOT, "An environment variable holding the key.")
    key_file: Path | None = setting(None, Reload.HOT, "A file (mode 0600) holding the key.")
    scopes: list[Scope] = setting(["inference"], Reload.HOT, "What the key may do.", min_length=1)
    models: list[str] | None = setting(
        None, Reload.HOT, "Model names or aliases the key may use; unset: every model."
    )
    rate_limit: KeyRateLimit = setting(KeyRateLimit(), Reload.HOT, "The key's own rate limit.")
    quota: KeyQuota = setting(KeyQuota(), Reload.HOT, "The key's token quotas.")

    _digest: bytes = PrivateAttr(default=b"")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not KEY_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a key name: letters, digits and . _ - (up to 64), "
                "starting with a letter or digit"
            )
        return value

    @field_validator("key_sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not SHA256_HEX.fullmatch(value):
            raise ValueError(
                "key_sha256 must be 64 hex digits (`vllm-mlx keys new NAME` prints one)"
            )
        return value.lower() if value else value

    @model_validator(mode="after")
    def _one_secret(self) -> NamedKey:
        given = [k for k in ("key_sha256", "key_env", "key_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"key '{self.name}' needs exactly one of key_sha256, key_env or key_file "
                f"(got {', '.join(given) or 'none'})"
            )
        self._digest = self._read_digest(given[0])
        return self

    def _read_digest(self, source: str) -> bytes:
        if self.key_sha256 is not None:
            return bytes.fromhex(self.key_sha256)
        if self.key_env is not None:
            value = os.environ.get(self.key_env, "")
            if not value:
                raise LocatedError(
                    f"the environment variable {self.key_env} is not set", ("key_env",)
                )
            return key_digest(_usable_secret(value, f"${self.key_env}"))
        assert self.key_file is not None
        path = self.key_file.expanduser()
        try:
            mode = path.stat().st_mode & 0o777
            text = path.read_text().strip()
        except OSError as exc:
            raise LocatedError(f"cannot read {path}: {exc.strerror}", ("key_file",)) from exc
        if mode & 0o077:
            raise LocatedError(
                f"{path} is readable by others (mode {mode:04o}); restrict it: chmod 600 {path}",
                ("key_file",),
            )
        return key_digest(_usable_secret(text, str(path)))

    @property
    def digest(self) -> bytes:
        return self._digest

    def has(self, scope: Scope) -> bool:
        return "admin" in self.scopes or scope in self.scopes


class AuthSettings(Section):
    api_keys: list[str] = setting(
        [],
        Reload.HOT,
        "Keys accepted on every route, with every scope, sent as `Authorization: Bearer "
        "KEY` or `x-api-key: KEY`. With this and `keys` both empty the API is open.",
    )
    keys: list[NamedKey] = setting(
        [],
        Reload.HOT,
        "Named keys, each `{name, key_sha256 | key_env | key_file, scopes, models, "
        "rate_limit: {requests_per_minute, tokens_per_minute}, quota: {tokens_per_day, "
        "tokens_per_month}}`. Scopes: `inference` (chat, completions, "
        "responses, messages, embeddings, tokenize, the model lists, Ollama's API), "
        "`models` (load and unload), `mcp` (/v1/mcp/*), `admin` (everything, /v1/status, "
        "/v1/usage and the cache routes included). Default scopes: [inference]; default "
        "models: all.",
        leaf=True,
    )
    rate_limit: int = setting(
        0,
        Reload.HOT,
        "Requests per minute per client on API routes (the key when one is sent, else the "
        "peer address); over it: 429 with Retry-After. 0 = off. A named key's own "
        "`rate_limit.requests_per_minute` replaces it for that key.",
        ge=0,
    )
    metrics_require_key: bool = setting(
        False,
        Reload.HOT,
        "Require an API key on /metrics too (the admin scope; it is open by default, like "
        "/health).",
    )

    @field_validator("api_keys")
    @classmethod
    def _usable_keys(cls, value: list[str]) -> list[str]:
        for key in value:
            _usable_secret(key, "API keys")
        return value

    @field_validator("keys")
    @classmethod
    def _distinct(cls, value: list[NamedKey]) -> list[NamedKey]:
        names: dict[str, int] = {}
        digests: dict[bytes, str] = {}
        for index, key in enumerate(value):
            if key.name in names:
                raise LocatedError(f"two keys are named '{key.name}'", (index, "name"))
            if key.digest in digests:
                raise LocatedError(
                    f"key '{key.name}' is the same secret as key '{digests[key.digest]}'",
                    (index,),
                )
            names[key.name], digests[key.digest] = index, key.name
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.keys)
