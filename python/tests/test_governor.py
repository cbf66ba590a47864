"""Budgets and pressure from Python: OutOfBudget with its figures, holders
evicting from Python callbacks, refusals by exception, rollback of a grow
whose update raises, two threads allocating under pressure."""
import threading

import pytest

import memplug
from conftest import MIB


def test_out_of_budget_carries_its_figures(mgr, ctx):
    pool = mgr.create_pool("small", 4 * MIB)
    b = mgr.bind(ctx, pool, "kv")
    keep = b.allocate(3 * MIB)
    with pytest.raises(memplug.OutOfBudget) as e:
        b.allocate(2 * MIB)
    err = e.value
    assert isinstance(err, memplug.MemplugError)
    assert (err.requested, err.used, err.capacity) == (2 * MIB, 3 * MIB, 4 * MIB)
    assert (err.pool, err.alloc_class, err.status) == ("small", "kv", "OUT_OF_BUDGET")
    assert pool.used == 3 * MIB, "the refusal changed nothing"
    keep.free()
    s = pool.stats()
    assert s["used"] == 0 and s["classes"]["kv"] == 0 and s["capacity"] == 4 * MIB


def test_pressure_callback_evicts_from_python(mgr, ctx):
    pool = mgr.create_pool("weights", 8 * MIB)
    experts = []  # least recently used first
    tickets = []

    def evict(ticket):
        tickets.append(ticket)
        freed = 0
        while experts and freed < ticket["bytes_wanted"]:
            e = experts.pop(0)
            freed += e.size
            e.free()
        return freed

    holder = pool.register_holder("weights", evict, priority=1)
    w = mgr.bind(ctx, pool, "weights", holder=holder)
    for _ in range(8):
        experts.append(w.allocate(MIB))
    assert pool.used == 8 * MIB
    kv = mgr.bind(ctx, pool, "kv")  # no holder: asks at the highest priority
    a = kv.allocate(3 * MIB)
    assert len(tickets) == 1 and tickets[0]["bytes_wanted"] == 3 * MIB
    assert tickets[0]["alloc_class"] == "kv"
    assert len(experts) == 5 and pool.used == 8 * MIB
    st = holder.stats()
    assert (st["tickets"], st["bytes_answered"]) == (1, 3 * MIB)
    a.free()
    holder.unregister()


def test_a_raising_callback_is_a_refusal_not_a_crash(mgr, ctx):
    pool = mgr.create_pool("refusing", 2 * MIB)
    seen = []

    def broken(ticket):
        seen.append(ticket["bytes_wanted"])
        raise RuntimeError("cannot evict now")

    reported = []
    import sys

    old, sys.unraisablehook = sys.unraisablehook, reported.append
    try:
        with pool.register_holder("broken", broken) as h:
            b = mgr.bind(ctx, pool, holder=h)
            keep = b.allocate(2 * MIB)
            other = mgr.bind(ctx, pool)
            with pytest.raises(memplug.OutOfBudget):
                other.allocate(MIB)
            assert seen == [MIB]
            assert h.stats()["zero_answers"] == 1
            keep.free()
    finally:
        sys.unraisablehook = old
    assert len(reported) == 1 and isinstance(reported[0].exc_value, RuntimeError)


def test_grow_rolls_back_when_the_update_raises(mgr, ctx, pool):
    r = mgr.bind(ctx, pool, "kv").reserve(16 * MIB)
    views = []
    r.grow_to(2 * MIB, lambda addr, n: views.append((addr, n)))
    assert views == [(r.addr, 2 * MIB)] and pool.used == 2 * MIB

    class TableFull(Exception):
        pass

    def refuse(addr, n):
        views.append((addr, n))
        raise TableFull("block table full")

    with pytest.raises(TableFull):
        r.grow_to(6 * MIB, refuse)
    assert views[-1] == (r.addr, 6 * MIB), "the update saw the grown view"
    assert (r.len, r.committed, pool.used) == (2 * MIB, 2 * MIB, 2 * MIB), "rolled back"
    with pytest.raises(memplug.InvalidArgument):
        r.grow_to(32 * MIB)  # past the reservation
    small = mgr.create_pool("tight", 3 * MIB)
    r2 = mgr.bind(ctx, small, "kv").reserve(16 * MIB)
    with pytest.raises(memplug.OutOfBudget):
        r2.grow_to(4 * MIB)
    assert r2.len == 0 and small.used == 0


def test_two_threads_allocate_under_pressure(mgr, ctx):
    capacity = 16 * MIB
    pool = mgr.create_pool("shared", capacity)
    lock = threading.Lock()
    cached = []  # evictable blocks, oldest first

    def evict(ticket):
        freed = 0
        with lock:
            while cached and freed < ticket["bytes_wanted"]:
                victim = cached.pop(0)
                freed += victim.size
                victim.free()
        return freed

    holder = pool.register_holder("lru", evict)
    # No holder of its own (a holder is never asked on its own behalf); a
    # block the other thread's ticket freed may be taken first, so a
    # request waits a little for room before it fails.
    b = mgr.bind(ctx, pool, "activations", wait=5.0)
    errors = []
    peak = [0]

    def worker():
        try:
            for _ in range(150):
                a = b.allocate(MIB)
                peak[0] = max(peak[0], pool.used)
                with lock:
                    cached.append(a)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert peak[0] <= capacity
    s = pool.stats()
    assert s["pressure"]["tickets"] >= 300 - 16
    assert s["pressure"]["bytes_answered"] >= (300 - 16) * MIB
    with lock:
        cached.clear()
    holder.unregister()
    assert pool.used == 0


def test_a_waiting_allocation_releases_the_gil(mgr, ctx):
    pool = mgr.create_pool("full", 2 * MIB)
    b = mgr.bind(ctx, pool, wait=10.0)
    keep = b.allocate(2 * MIB)
    got = []
    waiter = threading.Thread(target=lambda: got.append(b.allocate(MIB)))
    waiter.start()
    # The waiter is blocked in allocate; were it holding the GIL, this
    # thread could not free the room it waits for, and it would time out.
    import time

    deadline = time.monotonic() + 5
    while pool.stats()["waits"] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert pool.stats()["waits"] >= 1
    keep.free()
    waiter.join(10)
    assert len(got) == 1 and got[0].size == MIB
    got[0].free()


def test_nested_pools(mgr, ctx):
    parent = mgr.create_pool("node", 8 * MIB)
    a = mgr.create_child_pool(parent, "tenant-a", 6 * MIB)
    b = mgr.create_child_pool(parent, "tenant-b", 6 * MIB)
    s = parent.stats()
    assert (s["parent"], s["children"], s["depth"]) == (None, ["tenant-a", "tenant-b"], 0)
    assert (a.stats()["parent"], a.stats()["depth"], a.stats()["children"]) == ("node", 1, [])
    x = mgr.bind(ctx, a).allocate(5 * MIB)
    assert (a.used, parent.used) == (5 * MIB, 5 * MIB), "charged at the child and its parent"
    with pytest.raises(memplug.OutOfBudget) as e:
        mgr.bind(ctx, a).allocate(2 * MIB)  # the child's own cap
    assert e.value.pool == "tenant-a"
    with pytest.raises(memplug.OutOfBudget) as e:
        mgr.bind(ctx, b).allocate(4 * MIB)  # fits b, not the parent's room
    assert e.value.pool == "node"
    x.free()
    assert parent.used == 0
    with pytest.raises(memplug.MemplugError, match="tenant-a"):
        mgr.create_child_pool(parent, "tenant-a", MIB)  # names are unique
