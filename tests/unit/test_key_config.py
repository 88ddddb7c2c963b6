"""auth.keys in the file: every mistake is a file:line error naming the key path, and
secrets come from a hash, an environment variable or an owner-only file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_mlx.cli.keys import new_key_entry
from vllm_mlx.cli.main import main
from vllm_mlx.config.auth import key_digest
from vllm_mlx.config.errors import ConfigError, ConfigIssue
from vllm_mlx.config.file import load_settings

MODELS = """models:
  - name: chat
    source: builtin:smollm2-135m-instruct
    aliases: [default]
"""
HASH = "a" * 64


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith("VLLM_MLX_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def _write(tmp_path: Path, auth: str) -> Path:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODELS + "auth:\n  keys:\n" + auth)
    path.chmod(0o600)
    return path


def _issues(path: Path) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return caught.value.issues


APP = f"    - name: app\n      key_sha256: {HASH}\n"  # a good entry, lines 7-8
OTHER = f"    - name: b\n      key_sha256: {'b' * 64}\n"
CASES = [
    (APP + "      scopes: [root]\n", "auth.keys[0].scopes[0]", 9, "inference"),
    ("    - name: app\n      key_sha256: xyz\n", "auth.keys[0].key_sha256", 8, "64 hex"),
    ("    - name: app\n", "auth.keys[0]", 7, "exactly one of"),
    (APP + "      key_env: X\n", "auth.keys[0]", 7, "got key_sha256, key_env"),
    (APP.replace("app", "'a b'"), "auth.keys[0].name", 7, "not a key name"),
    ("    - name: app\n      key_env: VLLM_TEST_UNSET\n", "auth.keys[0].key_env", 8, "not set"),
    (APP + "      models: [chat, nope]\n", "auth.keys[0].models[1]", 9, "'nope', which is not"),
    (APP + OTHER.replace("name: b", "name: app"), "auth.keys[1].name", 9, "two keys are named"),
    (APP + OTHER.replace("b" * 64, HASH.upper()), "auth.keys[1]", 9, "same secret"),
    (
        APP + "      rate_limit: {requests_per_minute: -1}\n",
        "auth.keys[0].rate_limit.requests_per_minute",
        9,
        "greater than or equal",
    ),
    (
        APP + "      rate_limit: {tokens_per_minute: -5}\n",
        "auth.keys[0].rate_limit.tokens_per_minute",
        9,
        "greater than or equal",
    ),
    (
        APP + "      quota: {tokens_per_day: 0}\n",
        "auth.keys[0].quota.tokens_per_day",
        9,
        "greater than or equal to 1",
    ),
    (
        APP + "      quota: {tokens_per_week: 5}\n",
        "auth.keys[0].quota.tokens_per_week",
        9,
        "unknown key",
    ),
]


def test_a_quota_without_the_accounting_names_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, APP + "      quota: {tokens_per_month: 1000}\n")
    path.write_text(path.read_text() + "usage:\n  enabled: false\n")
    found = [i for i in _issues(path) if i.key_path == "auth.keys[0].quota"]
    assert found and found[0].line == 9 and "usage.enabled: false" in found[0].message


@pytest.mark.parametrize(("entry", "key_path", "line", "words"), CASES)
def test_a_bad_key_entry_names_its_path_and_line(
    tmp_path: Path, entry: str, key_path: str, line: int, words: str
) -> None:
    path = _write(tmp_path, entry)
    found = [i for i in _issues(path) if i.key_path == key_path]
    assert found, [str(i) for i in _issues(path)]
    assert found[0].origin == str(path) and found[0].line == line
    assert words in found[0].message


def test_secrets_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_TEST_APP_KEY", "sk-from-env")
    secret = tmp_path / "ops.key"
    secret.write_text("sk-from-file\n")
    secret.chmod(0o600)
    path = _write(
        tmp_path,
        f"    - name: app\n      key_env: VLLM_TEST_APP_KEY\n"
        f"    - name: ops\n      key_file: {secret}\n      scopes: [admin]\n",
    )
    keys = load_settings(path).auth.keys
    assert keys[0].digest == key_digest("sk-from-env")
    assert keys[1].digest == key_digest("sk-from-file")  # the newline is not part of it


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "ops.key"
    secret.write_text("sk-from-file")
    secret.chmod(0o644)
    path = _write(tmp_path, f"    - name: ops\n      key_file: {secret}\n")
    (issue,) = _issues(path)
    assert issue.key_path == "auth.keys[0].key_file" and issue.line == 8
    assert "chmod 600" in issue.message
    missing = _write(tmp_path, f"    - name: ops\n      key_file: {tmp_path / 'nope'}\n")
    assert "cannot read" in _issues(missing)[0].message


def test_keys_new_prints_a_key_and_its_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "ci", "--scopes", "inference,models", "--models", "default"]) == 0
    out = capsys.readouterr().out
    key = next(w for w in out.split() if w.startswith("sk-vllm-mlx-"))
    assert key_digest(key).hex() in out and "- models" in out.replace("  ", "")
    assert main(["keys", "new", "ci", "--scopes", "root"]) == 2
    assert "unknown scopes" in capsys.readouterr().err
    one, entry = new_key_entry("x", ["inference"], [])
    two, _ = new_key_entry("x", ["inference"], [])
    assert one != two and entry["key_sha256"] == key_digest(one).hex() and "models" not in entry
