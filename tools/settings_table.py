"""Print the README's settings tables from stratalog.gateway.config and .topic_configs:
`python tools/settings_table.py` (the settings), `python tools/settings_table.py inert`
(the topic configs accepted without effect)."""

from __future__ import annotations

import sys

from stratalog.gateway.config import BROKER_SETTINGS, TOPIC_CONFIGS
from stratalog.gateway.topic_configs import INERT


def _shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def render() -> str:
    topic_of = {b: t for t, b in TOPIC_CONFIGS.items()}
    rows = ["| setting | default | topic config | meaning |", "| --- | --- | --- | --- |"]
    for name, s in BROKER_SETTINGS.items():
        rows.append(f"| `{name}` | `{_shown(s.default)}` | {('`' + topic_of[name] + '`') if name in topic_of else ''} | {s.doc} |")
    return "\n".join(rows)


def render_inert() -> str:
    rows = ["| topic config | Kafka's default | in Kafka, and why not here |", "| --- | --- | --- |"]
    for name in sorted(INERT):
        c = INERT[name]
        rows.append(f"| `{name}` | `{_shown(c.default)}` | {c.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(render_inert() if sys.argv[1:] == ["inert"] else render())
