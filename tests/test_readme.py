"""The README documents every setting with its default, and its test command is the one CI runs."""

from pathlib import Path

import pytest

from stratalog.gateway.config import BROKER_SETTINGS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_is_in_the_readme_with_its_default():
    readme = (ROOT / "README.md").read_text()
    for name, s in BROKER_SETTINGS.items():
        default = str(s.default).lower() if isinstance(s.default, bool) else str(s.default)
        assert f"| `{name}` | `{default}` |" in readme, name


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/test.sh" in readme
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
