"""Print the README's settings table from stratalog.gateway.config: `python tools/settings_table.py`."""

from __future__ import annotations



from stratalog.gateway.config import BROKER_SETTINGS, TOPIC_CONFIGS


def render() -> str:
    topic_of = {b: t for t, b in TOPIC_CONFIGS.items()}
    rows = ["| setting | default | topic config | meaning |", "| --- | --- | --- | --- |"]
    for name, s in BROKER_SETTINGS.items():
        default = str(s.default).lower() if isinstance(s.default, bool) else s.default
        rows.append(f"| `{name}` | `{default}` | {('`' + topic_of[name] + '`') if name in topic_of else ''} | {s.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(render())
