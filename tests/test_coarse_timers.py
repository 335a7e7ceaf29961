"""Coarse timers: callbacks due within one tick share a timer; each runs once, after its
delay and at most a tick late, unless cancelled."""

import asyncio

import pytest

from stratalog.gateway.coarse_timers import TICK_S, coarse_timers

pytestmark = pytest.mark.unit


def test_due_callbacks_run_once_and_cancelled_ones_never():
    async def scenario():
        loop = asyncio.get_running_loop()
        ran: list[tuple[str, float]] = []
        started = loop.time()
        timers = coarse_timers()
        assert coarse_timers() is timers  # one per loop
        for name in ("a", "b"):
            timers.call_later(0.02, lambda name=name: ran.append((name, loop.time())))
        timers.call_later(0.02, lambda: ran.append(("cancelled", loop.time()))).cancel()
        timers.call_later(0.05, lambda: ran.append(("later", loop.time())))
        await asyncio.sleep(0.1)
        return started, ran

    started, ran = asyncio.run(scenario())
    assert [name for name, _ in ran] == ["a", "b", "later"]
    assert ran[0][1] - started >= 0.02 and ran[2][1] - started >= 0.05  # never early
    assert TICK_S <= 0.01


def test_an_acks_all_answer_past_its_timeout_says_request_timed_out():
    from stratalog.gateway.handlers.produce import _await_commit
    from stratalog.gateway.protocol.error_codes import ErrorCode

    async def scenario():
        loop = asyncio.get_running_loop()
        committed, stuck = loop.create_future(), loop.create_future()
        fast = {"index": 0, "error_code": 0}
        slow = {"index": 1, "error_code": 0}
        answered = _await_commit({"responses": [fast]}, [(fast, committed)], 10_000)
        late = _await_commit({"responses": [slow]}, [(slow, stuck)], 20)
        committed.set_result(None)
        return await answered, await late, stuck

    answered, late, stuck = asyncio.run(scenario())
    assert answered["responses"][0]["error_code"] == 0
    assert late["responses"][0]["error_code"] == ErrorCode.REQUEST_TIMED_OUT
    assert not stuck.done()  # the WAL's future is shared with other requests: left alone
