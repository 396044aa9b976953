"""The memory budgets of :mod:`proxy.budget`, driven directly under trio.

A connection's reader waits while its connection holds its limit (one
request larger than the limit still passes alone); the process-wide pool
stops connections holding 64 KiB or more while the process is over its cap,
lets lighter ones read, and wakes the waiting ones when bytes are given back.
"""

from __future__ import annotations

import trio
import trio.testing

from proxy.budget import POOL_FLOOR, Budget, MemoryPool


async def test_a_connection_waits_while_its_budget_is_full_and_an_oversized_request_passes_alone() -> None:
    pool = MemoryPool(1 << 40)
    budget = Budget(100, pool)
    await budget.acquire(500)  # larger than the whole budget: alone, it passes
    assert budget.used == 500 and pool.used == 500
    got = trio.Event()

    async def second() -> None:
        await budget.acquire(10)
        got.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not got.is_set(), "read on while the connection holds more than its budget"
        budget.release(500)
        await got.wait()
    assert budget.used == 10 and pool.used == 10
    budget.add(30)  # a response: counted at once, never waited for
    budget.release_all()
    assert budget.used == 0 and pool.used == 0


async def test_the_pool_stops_heavy_connections_over_the_cap_and_wakes_them_when_bytes_go() -> None:
    pool = MemoryPool(1000)
    pool.add(1500)
    assert pool.may_read(POOL_FLOOR - 1), "a light connection is still read"
    assert not pool.may_read(POOL_FLOOR)
    woke = trio.Event()

    async def heavy() -> None:
        await pool.wait_to_read(POOL_FLOOR)
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heavy)
        await trio.testing.wait_all_tasks_blocked()
        pool.sub(100)  # still over the cap: it keeps waiting
        await trio.testing.wait_all_tasks_blocked()
        assert not woke.is_set()
        pool.sub(500)
        await woke.wait()
    assert pool.used == 900
