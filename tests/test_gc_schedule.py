"""The gateway process's garbage-collection schedule (gateway/gc_schedule.py)."""

import asyncio
import gc
import weakref

import pytest

from stratalog.gateway.gc_schedule import FullCollections
from stratalog.gateway.metrics import GatewayMetrics

pytestmark = pytest.mark.unit


class _Node:
    def __init__(self):
        self.me = self


def _old_cycle() -> weakref.ref:
    """A reference cycle that outlived a collection of the middle generation (so it sits in
    the oldest) and is garbage now: only a full collection reclaims it."""
    node = _Node()
    gc.collect(1)
    return weakref.ref(node)


def test_full_collections_run_on_schedule_only_and_every_pause_is_counted():
    metrics = GatewayMetrics()
    before = gc.get_threshold()

    async def body():
        with FullCollections(metrics.gc_pauses, interval_s=0.2) as full:
            assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10 ** 8
            gone = _old_cycle()
            gc.collect(1)
            assert gone() is not None  # young collections leave it
            task = asyncio.create_task(full.run())
            try:
                for _ in range(100):
                    await asyncio.sleep(0.05)
                    if gone() is None:
                        break
            finally:
                task.cancel()
            assert gone() is None  # the scheduled full collection took it
            full_pauses = metrics.gc_pauses[2].counts
            assert sum(full_pauses) >= 1 and sum(metrics.gc_pauses[1].counts) >= 2

    asyncio.run(body())
    assert gc.get_threshold() == before
    counted = sum(metrics.gc_pauses[2].counts)
    gc.collect()
    assert sum(metrics.gc_pauses[2].counts) == counted  # no longer observed
    text = metrics.render().decode()
    assert f'stratalog_gc_pause_seconds_count{{generation="2"}} {float(counted)}' in text
