"""The topic configs an append reads, as one snapshot per topic.

An append used to ask for each config by name (max.message.bytes, cleanup.policy, the
timestamp type and bounds, segment.bytes: eight lookups, each through the topic's
overrides). A topic's configs change only when the gateway loads a new `TopicInfo` for it
(an AlterConfigs here, or a sync that read another gateway's change), so each topic's
`AppendSettings` is read once and kept until the `TopicInfo` the engine is given for it
is another object: one dictionary lookup and one identity check per append.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from stratalog.coordinator.model import TopicInfo

from .validation import TimestampBounds


@dataclass(frozen=True, slots=True)
class AppendSettings:
    """One topic's configs as an append applies them."""

    max_message_bytes: int
    compacted: bool  # cleanup.policy holds "compact": every record needs a key
    log_append_time: bool  # message.timestamp.type=LogAppendTime: the broker stamps batches
    timestamp_before_ms: int  # message.timestamp.before.max.ms, after.max.ms and the
    timestamp_after_ms: int  # deprecated difference.max.ms, as `TimestampBounds.of` takes them
    timestamp_difference_ms: int
    segment_bytes: int

    @classmethod
    def read(cls, topic: str, topic_config: Callable[[str, str], Any]) -> AppendSettings:
        return cls(max_message_bytes=topic_config(topic, "max.message.bytes"),
                   compacted="compact" in topic_config(topic, "cleanup.policy"),
                   log_append_time=topic_config(topic, "message.timestamp.type") == "LogAppendTime",
                   timestamp_before_ms=topic_config(topic, "message.timestamp.before.max.ms"),
                   timestamp_after_ms=topic_config(topic, "message.timestamp.after.max.ms"),
                   timestamp_difference_ms=topic_config(topic, "message.timestamp.difference.max.ms"),
                   segment_bytes=topic_config(topic, "segment.bytes"))

    def timestamp_bounds(self, now_ms: int) -> TimestampBounds | None:
        """The CreateTime timestamps accepted now (None: any; LogAppendTime topics stamp
        their own)."""
        if self.log_append_time:
            return None
        return TimestampBounds.of(now_ms, self.timestamp_before_ms, self.timestamp_after_ms,
                                  self.timestamp_difference_ms)


class TopicSettings:
    """Each topic's `AppendSettings`, read again when its `TopicInfo` is replaced."""

    def __init__(self, topic_info: Callable[[str], TopicInfo | None],
                 topic_config: Callable[[str, str], Any]):
        self._topic_info = topic_info
        self._topic_config = topic_config
        self._read: dict[str, tuple[TopicInfo, AppendSettings]] = {}

    def append(self, topic: str) -> AppendSettings:
        info = self._topic_info(topic)
        kept = self._read.get(topic)
        if kept is not None and kept[0] is info:
            return kept[1]
        settings = AppendSettings.read(topic, self._topic_config)
        if info is not None:
            self._read[topic] = (info, settings)
        else:  # a topic being deleted: nothing to key the snapshot on
            self._read.pop(topic, None)
        return settings

    def forget(self, topic: str) -> None:
        """The topic is deleted (a new one of the same name starts afresh)."""
        self._read.pop(topic, None)
