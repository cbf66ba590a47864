"""Zero-copy DLPack exchange with NumPy: same address, writes visible both
ways, read-only prefix views, the deleter after the manager is gone."""
import ctypes
import gc

import numpy as np
import pytest

import memplug
from conftest import MIB


def test_allocation_round_trip_is_zero_copy(mgr, ctx, pool):
    b = mgr.bind(ctx, pool, "activations")
    a = b.allocate(MIB)
    arr = np.from_dlpack(a.view((256, 1024), "float32"))
    assert arr.shape == (256, 1024) and arr.dtype == np.float32
    assert arr.ctypes.data == a.addr, "the array is the allocation's memory"
    assert arr.flags.writeable
    arr[3, 5] = 7.5
    raw = (ctypes.c_float * (256 * 1024)).from_address(a.addr)
    assert raw[3 * 1024 + 5] == 7.5, "a write through NumPy is in memplug memory"
    raw[10] = -2.0
    assert arr[0, 10] == -2.0, "a write to memplug memory is seen by NumPy"
    # The whole allocation as bytes, through __dlpack__ on the allocation.
    whole = np.from_dlpack(a)
    assert whole.dtype == np.uint8 and whole.size == a.size and whole.ctypes.data == a.addr
    assert a.__dlpack_device__() == (1, 0)


def test_offsets_strides_and_refusals(mgr, ctx, pool):
    a = mgr.bind(ctx, pool).allocate(4096)
    tail = np.from_dlpack(a.view(512, "uint8", offset=3584))
    assert tail.ctypes.data == a.addr + 3584
    t = np.from_dlpack(a.view((4, 8), np.float64, strides=[1, 4]))  # a transposed 8x4
    assert t.strides == (8, 32)
    with pytest.raises(memplug.ExportRefused) as e:
        a.view(1025, "float32")
    assert (e.value.needed, e.value.available, e.value.status) == (4100, 4096, "OUT_OF_RANGE")
    with pytest.raises(ValueError):
        a.view(4, "float128")
    copied = np.from_dlpack(a.view(16), copy=True)  # the array API's copy=True: a private copy
    assert copied.flags.writeable and copied.ctypes.data != a.addr
    with pytest.raises(BufferError):
        a.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    capsule = a.__dlpack__(max_version=(1, 1))
    assert "dltensor_versioned" in repr(capsule)
    del capsule  # never consumed: its destructor runs the deleter


def test_read_only_prefix_views_refuse_writes(mgr, ctx, pool):
    kv = mgr.bind(ctx, pool, "kv")
    prompt = b"You are a helpful assistant."
    prefix = kv.create_shared(MIB, prompt)
    r = kv.reserve(16 * MIB)
    r.map_prefix(prefix)
    assert r.prefix_is_read_only
    r.grow_to(len(prefix) + MIB)
    whole = np.from_dlpack(r.view(r.len, on_read_only="share"))
    assert not whole.flags.writeable and whole.ctypes.data == r.addr
    assert bytes(whole[: len(prompt)]) == prompt
    with pytest.raises(ValueError):
        whole[0] = 1
    private = np.from_dlpack(r.view(MIB, offset=len(prefix)))
    assert private.flags.writeable
    private[:4] = [1, 2, 3, 4]
    assert list(whole[len(prefix) : len(prefix) + 4]) == [1, 2, 3, 4]
    # An explicitly read-only view of private bytes.
    assert not np.from_dlpack(r.view(16, offset=len(prefix), read_only=True)).flags.writeable


def test_views_keep_the_region_and_block_shrinking(mgr, ctx, pool):
    r = mgr.bind(ctx, pool, "kv").reserve(16 * MIB)
    r.grow_to(2 * MIB)
    arr = np.from_dlpack(r.view(2 * MIB))
    assert r.views == 1
    r.grow_to(4 * MIB)  # growing under a view keeps the base
    assert r.addr == arr.ctypes.data
    with pytest.raises(memplug.InvalidState):
        r.shrink_to(MIB)
    r.close()
    arr[-1] = 9  # the view keeps the region alive
    assert pool.used == 4 * MIB
    del arr
    gc.collect()
    assert pool.used == 0


def test_deleter_after_the_manager_is_gone():
    def make():
        m = memplug.Manager()
        m.register_cpu_plugin()
        ctx = m.select("cpu")
        pool = m.create_pool("short-lived", 8 * MIB)
        a = m.bind(ctx, pool).allocate(MIB)
        return np.from_dlpack(a.view(MIB // 4, "float32")), pool

    arr, pool = make()
    gc.collect()  # the manager, context, binding and handle are gone
    arr[:] = 1.0
    assert arr.sum() == MIB // 4
    assert pool.used == MIB
    del arr
    gc.collect()
    assert pool.used == 0, "the deleter freed through memplug"


def test_cached_allocation_export_goes_back_to_the_cache(mgr, ctx, pool):
    c = mgr.bind_caching(ctx, pool, "workspace")
    a = c.allocate(MIB)
    addr = a.addr
    arr = np.from_dlpack(a.view(MIB))
    a.free()
    assert c.stats()["in_use_blocks"] == 1, "the array still uses the block"
    del arr
    gc.collect()
    s = c.stats()
    assert (s["in_use_blocks"], s["idle_blocks"]) == (0, 1)
    assert c.allocate(MIB).addr == addr


def test_context_managers_release(mgr, ctx, pool):
    b = mgr.bind(ctx, pool)
    with b.allocate(MIB) as a:
        assert pool.used == MIB
    assert pool.used == 0 and a.freed
    with pytest.raises(memplug.InvalidState):
        a.view(16)
    with b.reserve(4 * MIB) as r:
        r.grow_to(MIB)
        assert pool.used == r.committed
    assert pool.used == 0


class LegacyConsumerView:
    """What an array library older than DLPack 1.0 sees: `__dlpack__`
    without `max_version` (NumPy retries that way on a TypeError)."""

    def __init__(self, obj):
        self.obj = obj

    def __dlpack__(self, stream=None):
        return self.obj.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()


def test_legacy_and_versioned_capsules(mgr, ctx, pool):
    a = mgr.bind(ctx, pool).allocate(MIB)
    assert '"dltensor"' in repr(a.__dlpack__()), "no max_version: the legacy DLManagedTensor"
    assert '"dltensor"' in repr(a.__dlpack__(max_version=(0, 8)))
    assert '"dltensor_versioned"' in repr(a.__dlpack__(max_version=(1, 0)))
    gc.collect()
    assert pool.used == MIB, "unconsumed capsules gave their references back"
    old = np.from_dlpack(LegacyConsumerView(a.view((512, 512), "float32")))
    new = np.from_dlpack(a.view((512, 512), "float32"))
    # Zero-copy both ways; NumPy itself marks a legacy import read-only
    # (the unversioned struct cannot say whether writing is allowed).
    assert old.ctypes.data == new.ctypes.data == a.addr
    new[1, 2] = 4.5
    assert old[1, 2] == 4.5
    a.free()
    del new
    assert pool.used == MIB, "the legacy array keeps the memory"
    del old
    gc.collect()
    assert pool.used == 0, "the legacy deleter freed through memplug"


def test_read_only_memory_is_refused_to_a_legacy_consumer(mgr, ctx, pool):
    kv = mgr.bind(ctx, pool, "kv")
    prefix = kv.create_shared(MIB, b"system prompt")
    r = kv.reserve(8 * MIB)
    r.map_prefix(prefix)
    with pytest.raises(BufferError, match="read-only"):
        r.__dlpack__()
    with pytest.raises(BufferError, match="read-only"):
        np.from_dlpack(LegacyConsumerView(r.view(16)))
    assert not np.from_dlpack(r.view(16, on_read_only="share")).flags.writeable
