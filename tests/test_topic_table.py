"""The gateway's topic table against a reload that races its own changes."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from stratalog.coordinator.model import TopicInfo
from stratalog.gateway.topic_admin import TopicTable

pytestmark = pytest.mark.unit


class SlowStore:
    """The two reads a reload makes; the topics read waits until released (the reads were
    made before a change that lands while they are in flight)."""

    def __init__(self, topics: dict[str, TopicInfo]):
        self.topics_now = dict(topics)
        self.release = asyncio.Event()

    async def topics(self) -> dict[str, TopicInfo]:
        snapshot = dict(self.topics_now)
        await self.release.wait()
        return snapshot

    async def all_partition_states(self) -> dict:
        return {}


def topic(name: str) -> TopicInfo:
    return TopicInfo(name, uuid.uuid4(), 1, 1, {})


def test_a_reload_under_way_does_not_bring_back_a_topic_deleted_here_nor_hide_one_created_here():
    # Kafka's Java AdminClient listed a topic just deleted through the same gateway: a tick's
    # reload that had read the topics before the deletion put it back until the next tick.
    async def main():
        old, kept = topic("old"), topic("kept")
        store = SlowStore({"old": old, "kept": kept})
        table = TopicTable()
        table.put(old)
        table.put(kept)
        reload = asyncio.ensure_future(table.load(store))
        await asyncio.sleep(0)  # the reload has read the topics
        table.remove(old)
        new = topic("new")
        table.put(new)
        store.release.set()
        await reload
        assert set(table.by_name) == {"kept", "new"} and set(table.by_id) == {kept.topic_id, new.topic_id}
        # The next reload reads the coordinator as it is: the changes stored there stay.
        store.topics_now = {"kept": kept, "new": new}
        await table.load(store)
        assert set(table.by_name) == {"kept", "new"}
        # A topic of the same name made elsewhere after a local delete is not removed again.
        again = topic("old")
        store.topics_now["old"] = again
        await table.load(store)
        assert table.by_name["old"] is again

    asyncio.run(main())
