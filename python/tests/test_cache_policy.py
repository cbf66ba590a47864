"""The caching binding's idle policy from Python: a cap on idle bytes (a
quarter of the pool unless set), an age, a usage threshold, and collect()."""

import time

import pytest

import memplug

MIB = 1 << 20


def test_the_idle_cap_holds_at_every_free(mgr, ctx, pool):
    c = mgr.bind_caching(ctx, pool, "activations", max_idle_bytes=3 * MIB)
    assert c.max_idle_bytes == 3 * MIB
    blocks = [c.allocate(MIB) for _ in range(6)]
    for b in blocks:
        b.free()
        assert c.stats()["idle_bytes"] <= 3 * MIB
    assert pool.used == 3 * MIB
    assert c.stats()["trimmed_bytes"] == 3 * MIB


def test_the_default_cap_is_a_quarter_of_the_pool(mgr, ctx, pool):
    c = mgr.bind_caching(ctx, pool)
    assert c.max_idle_bytes == 16 * MIB  # the pool holds 64 MiB
    keep_nothing = mgr.bind_caching(ctx, pool, holder_name="none", max_idle_bytes=0)
    keep_nothing.allocate(MIB).free()
    assert pool.used == 0


def test_collect_gives_back_blocks_past_their_age(mgr, ctx, pool):
    c = mgr.bind_caching(ctx, pool, max_idle_age=0.05)
    for b in [c.allocate(MIB) for _ in range(2)]:
        b.free()
    assert c.collect() == 0, "young blocks stay"
    time.sleep(0.15)
    assert c.collect() == 2 * MIB
    assert pool.used == 0


def test_a_threshold_outside_0_1_is_refused(mgr, ctx, pool):
    with pytest.raises(memplug.MemplugError, match="gc_threshold 1.5"):
        mgr.bind_caching(ctx, pool, gc_threshold=1.5)
