"""What DescribeConfigs (and CreateTopics v5+) say about a config: its value, where the
value comes from, its synonyms, its type and its documentation.

As in Kafka, a topic config's value comes from the topic itself (DYNAMIC_TOPIC_CONFIG), else
from the broker setting the operator gave (STATIC_BROKER_CONFIG), else from that setting's
default (DEFAULT_CONFIG); with synonyms asked, the response lists that chain, most specific
first. Broker settings are static: given (STATIC_BROKER_CONFIG) or default.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import topic_configs
from .config import BROKER_SETTINGS, TOPIC_CONFIGS, BrokerConfig, Setting, setting_type
from .topic_configs import INERT

# DescribeConfigs config_source values
DYNAMIC_TOPIC, STATIC_BROKER, DEFAULT = 1, 4, 5
# DescribeConfigs config_type values (Kafka's ConfigDef types)
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "LONG": 5, "DOUBLE": 6, "LIST": 7}


def render(value: Any) -> str:
    """A value as Kafka's DescribeConfigs writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def synonyms(config: BrokerConfig, overrides: Mapping[str, str], name: str, value: Any) -> list[dict]:
    """Where the value may come from, most specific first: the topic's value, the broker
    setting the operator gave, that setting's default (each only if it exists)."""
    chain = []
    if name in overrides:
        chain.append({"name": name, "value": render(value), "source": DYNAMIC_TOPIC})
    inert = INERT.get(name)
    if inert is not None:
        if inert.synonym is not None:
            chain.append({"name": inert.synonym, "value": render(inert.default), "source": DEFAULT})
        return chain
    chain += broker_synonyms(config, BROKER_SETTINGS[TOPIC_CONFIGS[name]])
    return chain


def broker_synonyms(config: BrokerConfig, setting: Setting) -> list[dict]:
    """A broker setting's value as given by the operator, then its default."""
    shown = (lambda v: None) if setting.sensitive else render
    chain = []
    if setting.name in config.given:
        chain.append({"name": setting.name, "value": shown(config[setting.name]), "source": STATIC_BROKER})
    chain.append({"name": setting.name, "value": shown(setting.default), "source": DEFAULT})
    return chain


def topic(config: BrokerConfig, overrides: Mapping[str, str], keys: set[str] | None, *,
          include_synonyms: bool, include_documentation: bool) -> list[dict]:
    """DescribeConfigs rows of a topic's configs (all of them, or those named in `keys`)."""
    rows = []
    for name, value in topic_configs.values(config, overrides).items():
        if keys is not None and name not in keys:
            continue
        chain = synonyms(config, overrides, name, value)
        source = chain[0]["source"] if chain else DEFAULT
        rows.append({"name": name, "value": render(value), "read_only": False,
                     "is_default": source == DEFAULT, "config_source": source, "is_sensitive": False,
                     "synonyms": chain if include_synonyms else [],
                     "config_type": CONFIG_TYPES[topic_configs.kind(name)],
                     "documentation": topic_configs.documentation(name) if include_documentation else None})
    return rows


def broker(config: BrokerConfig, keys: set[str] | None, *, include_synonyms: bool,
           include_documentation: bool) -> list[dict]:
    """DescribeConfigs rows of this gateway's settings (read-only: they are static)."""
    rows = []
    for name, value in sorted(config.items()):
        if keys is not None and name not in keys:
            continue
        setting = BROKER_SETTINGS[name]
        chain = broker_synonyms(config, setting)
        rows.append({"name": name, "value": None if setting.sensitive else render(value), "read_only": True,
                     "is_default": chain[0]["source"] == DEFAULT, "config_source": chain[0]["source"],
                     "is_sensitive": setting.sensitive, "synonyms": chain if include_synonyms else [],
                     "config_type": CONFIG_TYPES[setting_type(setting.parse)],
                     "documentation": setting.doc if include_documentation else None})
    return rows
