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


def test_requests_waiting_on_one_commit_each_end_at_their_own_deadline():
    """Requests whose batches share a commit share its deadline timer: a later request with
    a shorter timeout still ends on time, one with a longer timeout is not ended by it, and
    a request over two partitions is answered once both commits end. (The short deadline
    is checked while the long one is still far off: not a bound on the machine's speed.)"""
    from stratalog.engine.wal_writer import WalCommitFailed
    from stratalog.gateway.handlers.produce import _await_commit
    from stratalog.gateway.protocol.error_codes import ErrorCode

    def part(i):
        return {"index": i, "error_code": 0}

    async def scenario():
        loop = asyncio.get_running_loop()
        stuck, failing, other = loop.create_future(), loop.create_future(), loop.create_future()
        long_, short, two = part(0), part(0), [part(0), part(1)]
        started = loop.time()
        patient = _await_commit({"r": [long_]}, [(long_, stuck)], 1000)
        hasty = _await_commit({"r": [short]}, [(short, stuck)], 20)
        both = _await_commit({"r": two}, [(two[0], failing), (two[1], other)], 10_000)
        await hasty
        hasty_at = loop.time() - started
        assert not patient.done()
        failing.set_exception(WalCommitFailed("fenced"))
        await asyncio.sleep(0.01)
        assert not both.done()  # partition 1 still waits
        other.set_result(None)
        await both
        await patient
        return hasty_at, loop.time() - started, short, long_, two, stuck

    hasty_at, patient_at, short, long_, two, stuck = asyncio.run(scenario())
    assert hasty_at >= 0.02 - TICK_S and patient_at >= 1.0 - TICK_S  # never early by more than a tick
    assert short["error_code"] == long_["error_code"] == ErrorCode.REQUEST_TIMED_OUT
    assert two[0]["error_code"] == error_code_of("fenced") and two[1]["error_code"] == 0
    assert not stuck.done()


def error_code_of(message: str) -> int:
    from stratalog.engine.wal_writer import WalCommitFailed
    from stratalog.gateway.errors import error_code

    return error_code(WalCommitFailed(message))
