"""The API specs kept in tests/fixtures/specs, against the shared folder they are copied from.

The tests validate against the in-repo copies, so a clone needs nothing beside it. Where
the project's shared folder `../shared/specs` sits next to the repository root, each copy
must equal its file there byte for byte; where that folder is absent (a fresh clone), the
comparison is skipped.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from tests.support.spec import SPECS

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "specs"
OURS = {"README.md", ".gitattributes"}  # written here, not copies
FIXTURES = "tests/fixtures/specs"


def _specs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in OURS)


COPIES = _specs(SPECS)

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(),
    reason=f"{SHARED} is absent (no shared folder beside the repository root, as in a "
    "fresh clone): nothing to compare the in-repo spec copies with",
)


def test_the_specs_the_tests_read_are_in_the_repository_with_their_provenance() -> None:
    assert SPECS == REPO / FIXTURES
    expected = {
        "anthropic-hosted_spec.json",
        "ollama-api.md",
        "ollama-openapi.yaml",
        "openai-openapi.yaml",
    }
    missing = sorted(expected - set(COPIES))
    assert not missing, f"{FIXTURES} lacks {', '.join(missing)}: the tests read them from there"
    readme = (SPECS / "README.md").read_text()
    for name in COPIES:
        assert f"| `{name}` |" in readme, (
            f"{FIXTURES}/{name} has no row in {FIXTURES}/README.md: add its source and licence"
        )


@needs_shared
@pytest.mark.parametrize("name", COPIES)
def test_each_copy_equals_the_shared_spec_byte_for_byte(name: str) -> None:
    shared = SHARED / name
    assert shared.is_file(), (
        f"{FIXTURES}/{name} is not in {SHARED}: if it was removed or renamed there, "
        f"do the same here and in {FIXTURES}/README.md"
    )
    assert filecmp.cmp(SPECS / name, shared, shallow=False), (
        f"{FIXTURES}/{name} differs from {shared}: copy it over "
        f"(cp {shared} {FIXTURES}/) and update its row in {FIXTURES}/README.md"
    )


@needs_shared
def test_every_shared_spec_has_a_copy() -> None:
    missing = sorted(set(_specs(SHARED)) - set(COPIES))
    assert not missing, (
        f"{SHARED} has {', '.join(missing)}, which {FIXTURES} lacks: copy each over "
        f"(cp {SHARED}/NAME {FIXTURES}/) and add its row to {FIXTURES}/README.md"
    )
