"""Offload and restore at the same address, and copy-on-write of part of a
shared prefix, from Python (the host's transactions, on the CPU plugin)."""

import gc

import numpy as np
import pytest

import memplug

from conftest import MIB


@pytest.fixture
def stream(ctx):
    with ctx.create_stream() as s:
        yield s


def test_offload_and_restore_keep_the_address_and_the_bytes(mgr, ctx, pool, stream):
    host_pool = mgr.create_pool("host", 64 * MIB)
    kv, host = mgr.bind(ctx, pool, "kv"), mgr.bind(ctx, host_pool)
    r = kv.reserve(16 * MIB)
    r.grow_to(2 * MIB)
    view = np.from_dlpack(r.view(2 * MIB))
    view[:] = np.arange(2 * MIB, dtype=np.uint64).view(np.uint8)[: 2 * MIB]
    want = view.copy()
    with pytest.raises(memplug.InvalidState, match="view"):
        r.offload_to(host, stream)  # a live view may read any byte
    del view
    gc.collect()
    base = r.addr
    assert r.offload_to(host, stream) == {"released": 2 * MIB, "kept": 0}
    where, addr, size = r.residence
    assert (where, size) == ("host", 2 * MIB)
    assert (pool.used, host_pool.used) == (0, 2 * MIB)
    with pytest.raises(memplug.InvalidState, match="offloaded"):
        r.grow_to(4 * MIB)
    assert r.restore(stream).wait(10)
    assert r.addr == base and r.residence == ("device", 0, 0)
    assert np.array_equal(np.from_dlpack(r.view(2 * MIB)), want)
    mgr.poll()
    assert (pool.used, host_pool.used) == (2 * MIB, 0)
    with pytest.raises(memplug.InvalidState, match="not offloaded"):
        r.restore(stream)


def test_privatise_gives_one_region_its_own_copy_of_the_last_block(mgr, ctx, pool, stream):
    kv = mgr.bind(ctx, pool, "kv")
    prompt = b"You are a helpful assistant."
    prefix = kv.create_shared(MIB, prompt)
    a, b = kv.reserve(16 * MIB), kv.reserve(16 * MIB)
    a.map_prefix(prefix)
    b.map_prefix(prefix)
    block = 64 << 10
    assert a.privatise(len(prefix) - block, block, stream).wait(10)
    assert pool.used == len(prefix) + block, "the prefix once, the private block once"
    with pytest.raises(memplug.InvalidArgument, match="already private"):
        a.privatise(len(prefix) - block, block, stream)
    with pytest.raises(memplug.InvalidArgument):
        a.privatise(1, block, stream)
    # The prefix is read-only: NumPy honours the flag, so share it.
    whole_a = np.from_dlpack(a.view(a.len, on_read_only="share"))
    whole_b = np.from_dlpack(b.view(b.len, on_read_only="share"))
    # The privatised block is a's own, writable memory: no choice needed.
    own = np.from_dlpack(a.view(block, offset=len(prefix) - block))
    assert own.flags.writeable and own.ctypes.data == a.addr + len(prefix) - block
    with pytest.raises(BufferError, match="read-only"):
        np.from_dlpack(b.view(block, offset=len(prefix) - block))
    del own
    assert bytes(whole_a[: len(prompt)]) == prompt
    assert np.array_equal(whole_a, whole_b), "the private copy holds the shared bytes"
    with pytest.raises(memplug.InvalidState, match="view"):
        a.privatise(0, block, stream)  # a live view may read the range
    del whole_a, whole_b
    gc.collect()
    a.close()
    b.close()
    del prefix
    gc.collect()
    mgr.poll()
    assert pool.used == 0
