"""Memory on the wire from Python (memplug.Ucx, UcxPeer, ...): an owner
process (a child Python) fills a region, registers it and offers it; this
process pulls it into a region of its own over UCX (TCP on loopback, and
shared memory), and NumPy reads the bytes where they landed through
DLPack, without a copy. The pull is charged first (OutOfBudget moves
nothing), a page pushed back lands in the owner's region, a held range
cannot be deregistered, and bad input is refused. The same for
allocations: the owner registers one and frees it at once (it stays
allocated and charged until deregistered), this side pulls it into an
allocation of its own that NumPy reads at its address through DLPack.
And for cached blocks of a caching binding: registered whole or in part,
freed while registered or with a pull in flight, such a block goes to no
other request (on the stream it was freed on, or from another thread)
until the deregistration or the pull's completion. Skipped without UCX."""
import socket
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import memplug

MIB = 1 << 20

pytestmark = pytest.mark.skipif(
    memplug.Ucx.unavailable() is not None, reason=f"UCX is not usable here: {memplug.Ucx.unavailable()}"
)

TRANSPORTS = {
    "tcp": ({"TLS": "tcp", "NET_DEVICES": "lo"}, "peer"),
    "shared-memory": ({"TLS": "posix,cma,self"}, "none"),
}

# The owner: 2 MiB of a region filled with i % 251, registered read-write
# and offered; it serves until this side leaves, then checks the page this
# side pushed back and deregisters. Prints what it saw; exits non-zero on
# any surprise.
OWNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import memplug

    fd, transport = int(sys.argv[1]), sys.argv[2]
    settings, errors = {transports}[transport]
    m = memplug.Manager()
    m.register_cpu_plugin()
    ctx = m.select("cpu", 0, virtual_backing=True)
    pool = m.create_pool("owner", 8 << 20)
    r = m.bind(ctx, pool, "kv").reserve(4 << 20)
    r.grow_to(2 << 20)
    np.from_dlpack(r.view(2 << 20))[:] = np.arange(2 << 20) % 251
    ucx = memplug.Ucx(settings)
    reg = ucx.register_region(ctx, r, 0, 2 << 20, "read_write")
    peer = memplug.UcxPeer(ucx, fd, errors=errors)
    peer.offer(reg, 7)
    try:
        reg.deregister()
        sys.exit("deregistered while held")
    except memplug.MemplugError as e:
        assert e.status == "BUSY", e.status
    assert peer.serve(30.0), "the peer did not leave"
    got = np.from_dlpack(r.view(2 << 20))
    want = np.arange(2 << 20) % 251
    want[:4096] = 255 - want[:4096]
    assert (got == want).all(), "the pushed page did not land"
    del got  # a live view keeps the region (and its charge) alive
    reg.deregister()
    peer.close()
    r.close()
    assert pool.used == 0, pool.used
    print("owner: ok")
    """
).replace("{transports}", repr(TRANSPORTS))


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_a_pull_lands_in_a_region_numpy_reads(mgr, transport):
    settings, errors = TRANSPORTS[transport]
    mine, theirs = socket.socketpair()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(theirs.fileno()), transport],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    theirs.close()
    try:
        ctx = mgr.select("cpu", 0, virtual_backing=True)
        pool = mgr.create_pool("puller", 3 * MIB)
        r = mgr.bind(ctx, pool, "kv").reserve(8 * MIB)
        ucx = memplug.Ucx(settings)
        with memplug.UcxPeer(ucx, mine.fileno(), timeout=30.0, errors=errors) as peer:
            rng = peer.next_offer(30.0)
            assert (rng.len, rng.tag, rng.writable) == (2 * MIB, 7, True)

            # Past the budget: refused before any byte moves.
            with pytest.raises(memplug.OutOfBudget):
                peer.pull_into_region(r, 2 * MIB, rng, 0, 2 * MIB)
            assert pool.used == 0 and r.len == 0

            t = peer.pull_into_region(r, 0, rng, 0, 2 * MIB)
            t.wait(30.0)
            assert t.done and t.bytes == 2 * MIB and pool.used == 2 * MIB
            arr = np.from_dlpack(r.view(2 * MIB))
            assert arr.ctypes.data == r.addr  # no copy: the bytes where UCX put them
            assert (arr == np.arange(2 * MIB) % 251).all()

            arr[:4096] = 255 - arr[:4096]
            peer.push_from_region(r, 0, rng, 0, 4096).wait(30.0)
            peer.release(rng, 30.0)
            with pytest.raises(memplug.InvalidState, match="released by this side"):
                peer.pull_into_region(r, 0, rng, 0, 16)
            del arr
        out, _ = owner.communicate(timeout=60)
        assert owner.returncode == 0, out
        assert "owner: ok" in out
        r.close()
        assert pool.used == 0
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        mine.close()


def test_bad_input_is_refused(mgr):
    ctx = mgr.select("cpu", 0, virtual_backing=True)
    r = mgr.bind(ctx, mgr.create_pool("bad", 4 * MIB), "kv").reserve(4 * MIB)
    r.grow_to(MIB)
    ucx = memplug.Ucx({"TLS": "tcp", "NET_DEVICES": "lo"})
    with pytest.raises(memplug.InvalidArgument, match="read_write"):
        ucx.register_region(ctx, r, 0, MIB, "write")
    with pytest.raises(memplug.InvalidArgument, match="not inside"):
        ucx.register_region(ctx, r, 0, 2 * MIB)
    with pytest.raises(memplug.InvalidArgument, match="not a connected stream socket"):
        with open(__file__) as f:
            memplug.UcxPeer(ucx, f.fileno())
    with pytest.raises(memplug.InvalidArgument, match="NUL"):
        memplug.Ucx({"TLS": "tcp\0"})
    reg = ucx.register_region(ctx, r, 0, MIB)
    assert (reg.addr, reg.len, reg.holders) == (r.addr, MIB, 0)
    reg.deregister()
    with pytest.raises(memplug.InvalidState):
        reg.deregister()
    r.close()


# The owner of an allocation: 1 MiB filled with i % 241, registered
# read-write, offered, and freed at once: the bytes stay allocated and
# charged while registered. A NumPy view made while it is registered does
# not wait for the deregistration. It checks the page this side pushed
# back, deregisters, and sees its pool go back to 0.
ALLOC_OWNER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import memplug

    fd, transport = int(sys.argv[1]), sys.argv[2]
    settings, errors = {transports}[transport]
    m = memplug.Manager()
    m.register_cpu_plugin()
    ctx = m.select("cpu", 0)
    pool = m.create_pool("owner", 8 << 20)
    a = m.bind(ctx, pool, "kv").allocate(1 << 20, 4096)
    ucx = memplug.Ucx(settings)
    reg = ucx.register_allocation(ctx, a, "read_write")
    assert (reg.addr, reg.len) == (a.addr, 1 << 20), (reg.addr, reg.len)
    view = np.from_dlpack(a)  # not held up by the registration
    view[:] = np.arange(1 << 20) % 241
    peer = memplug.UcxPeer(ucx, fd, errors=errors)
    peer.offer(reg, 8)
    a.free()
    m.poll()
    assert pool.used == 1 << 20, pool.used
    assert peer.serve(30.0), "the peer did not leave"
    want = np.arange(1 << 20) % 241
    want[:4096] = 255 - want[:4096]
    assert (view == want).all(), "the pushed page did not land"
    del view
    m.poll()
    assert pool.used == 1 << 20, ("freed while registered", pool.used)
    reg.deregister()
    deadline = time.monotonic() + 10
    while pool.used and time.monotonic() < deadline:
        m.poll()
        time.sleep(0.001)
    assert pool.used == 0, pool.used
    peer.close()
    print("owner: ok")
    """
).replace("{transports}", repr(TRANSPORTS))


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_a_pull_lands_in_an_allocation_numpy_reads(mgr, transport):
    settings, errors = TRANSPORTS[transport]
    mine, theirs = socket.socketpair()
    owner = subprocess.Popen(
        [sys.executable, "-c", ALLOC_OWNER, str(theirs.fileno()), transport],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    theirs.close()
    try:
        ctx = mgr.select("cpu", 0)
        pool = mgr.create_pool("puller", 2 * MIB)
        a = mgr.bind(ctx, pool, "kv").allocate(MIB, 4096)
        assert pool.used == MIB  # the receiving side's charge, before any byte
        ucx = memplug.Ucx(settings)
        with memplug.UcxPeer(ucx, mine.fileno(), timeout=30.0, errors=errors) as peer:
            rng = peer.next_offer(30.0)
            assert (rng.len, rng.tag, rng.writable) == (MIB, 8, True)
            with pytest.raises(memplug.InvalidArgument, match="not inside the allocation"):
                peer.pull_into_allocation(a, 4096, rng, 0, MIB)

            t = peer.pull_into_allocation(a, 0, rng, 0, MIB)
            t.wait(30.0)
            assert t.done and t.bytes == MIB and pool.used == MIB
            arr = np.from_dlpack(a)
            assert arr.ctypes.data == a.addr  # no copy: the bytes where UCX put them
            assert (arr == np.arange(MIB) % 241).all()

            arr[:4096] = 255 - arr[:4096]
            peer.push_from_allocation(a, 0, rng, 0, 4096).wait(30.0)
            peer.release(rng, 30.0)
            del arr
        out, _ = owner.communicate(timeout=60)
        assert owner.returncode == 0, out
        assert "owner: ok" in out
        a.free()
        mgr.poll()
        assert pool.used == 0
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        mine.close()


def test_bad_allocations_are_refused(mgr):
    ctx = mgr.select("cpu", 0)
    pool = mgr.create_pool("bad-alloc", 4 * MIB)
    a = mgr.bind(ctx, pool, "kv").allocate(MIB, 4096)
    ucx = memplug.Ucx({"TLS": "tcp", "NET_DEVICES": "lo"})
    with pytest.raises(memplug.InvalidArgument, match="read_write"):
        ucx.register_allocation(ctx, a, "write")
    reg = ucx.register_allocation(ctx, a)
    assert (reg.addr, reg.len, reg.holders) == (a.addr, MIB, 0)
    # Freed while registered: the handle is gone, the bytes are not.
    a.free()
    mgr.poll()
    assert pool.used == MIB
    with pytest.raises(memplug.InvalidState, match="allocation was released"):
        ucx.register_allocation(ctx, a)
    reg.deregister()
    mgr.poll()
    assert pool.used == 0


# The owner of a cached block: filled with i % 239, registered read-write
# (and a part of it), offered, freed on stream 7 behind finished work:
# stream 7, the host and another thread each get another block, trim gives
# nothing back. It stalls (this side's pull into its own cached block stays
# in flight), serves until this side leaves, finds the pushed page in its
# freed block, deregisters, and gets the block back on stream 7.
CACHED_OWNER = textwrap.dedent(
    """
    import ctypes, sys, threading, time
    import numpy as np
    import memplug

    fd, transport = int(sys.argv[1]), sys.argv[2]
    settings, errors = {transports}[transport]
    m = memplug.Manager()
    m.register_cpu_plugin()
    ctx = m.select("cpu", 0)
    pool = m.create_pool("owner", 8 << 20)
    cache = m.bind_caching(ctx, pool, "kv", max_idle_bytes=2**64 - 1)
    a = cache.allocate_on(1 << 20, 7, 4096)
    addr = a.addr
    view = np.from_dlpack(a)
    view[:] = np.arange(1 << 20) % 239
    del view  # no export shares the block: its free goes to the cache
    ucx = memplug.Ucx(settings)
    for off, n in [(0, 0), (1 << 20, 1), (4096, 2**64 - 1)]:
        try:
            ucx.register_allocation_range(ctx, a, off, n)
            sys.exit(f"registered +{off} ({n} B)")
        except memplug.InvalidArgument as e:
            assert "not inside the allocation" in str(e), str(e)
    part = ucx.register_allocation_range(ctx, a, 4096, 8192)
    assert (part.addr, part.len) == (addr + 4096, 8192), (part.addr, part.len)
    part.deregister()
    reg = ucx.register_allocation(ctx, a, "read_write")
    assert (reg.addr, reg.len) == (addr, 1 << 20)
    peer = memplug.UcxPeer(ucx, fd, errors=errors)
    peer.offer(reg, 9)
    a.free_on(7, m.fence_from(lambda: True))
    same = cache.allocate_on(1 << 20, 7, 4096)
    host = cache.allocate(1 << 20, 4096)
    got = []
    t = threading.Thread(target=lambda: got.append(cache.allocate(1 << 20, 4096)))
    t.start()
    t.join()
    assert addr not in (same.addr, host.addr, got[0].addr), "a registered block was handed out"
    assert cache.trim(2**64 - 1) == 0
    assert cache.stats()["pinned_blocks"] == 1 and pool.used == 4 << 20, (cache.stats(), pool.used)
    time.sleep(1.0)
    assert peer.serve(30.0), "the peer did not leave"
    want = (np.arange(1 << 20) % 239).astype(np.uint8)
    want[:4096] = 255 - want[:4096]
    seen = np.frombuffer(ctypes.string_at(addr, 1 << 20), dtype=np.uint8)
    assert (seen == want).all(), "the pushed page did not land in the freed block"
    m.poll()
    assert pool.used == 4 << 20, pool.used
    reg.deregister()
    back = cache.allocate_on(1 << 20, 7, 4096)
    assert back.addr == addr, "the deregistered block is not reused"
    assert cache.stats()["pinned_blocks"] == 0
    for b in (back, same, host, got[0]):
        b.free()
    assert cache.trim(2**64 - 1) == 4 << 20
    m.poll()
    assert pool.used == 0, pool.used
    peer.close()
    print("owner: ok")
    """
).replace("{transports}", repr(TRANSPORTS))


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_a_cached_block_on_the_wire_is_kept_from_reuse(mgr, transport):
    settings, errors = TRANSPORTS[transport]
    mine, theirs = socket.socketpair()
    owner = subprocess.Popen(
        [sys.executable, "-c", CACHED_OWNER, str(theirs.fileno()), transport],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    theirs.close()
    try:
        ctx = mgr.select("cpu", 0)
        pool = mgr.create_pool("puller", 4 * MIB)
        cache = mgr.bind_caching(ctx, pool, "kv", max_idle_bytes=2**64 - 1)
        ucx = memplug.Ucx(settings)
        with memplug.UcxPeer(ucx, mine.fileno(), timeout=30.0, errors=errors) as peer:
            rng = peer.next_offer(30.0)
            assert (rng.len, rng.tag, rng.writable) == (MIB, 9, True)
            pa = cache.allocate_on(MIB, 7, 4096)
            addr = pa.addr
            with pytest.raises(memplug.InvalidArgument, match="not inside the allocation"):
                peer.pull_into_allocation(pa, 1, rng, 0, MIB)
            # The owner stalls: the get is in flight when the block is freed.
            t = peer.pull_into_allocation(pa, 0, rng, 0, MIB)
            pa.free_on(7, mgr.fence_from(lambda: True))
            same = cache.allocate_on(MIB, 7, 4096)
            got = []
            th = threading.Thread(target=lambda: got.append(cache.allocate(MIB, 4096)))
            th.start()
            th.join()
            assert not t.done, "the owner's stall should keep the get in flight"
            assert addr not in (same.addr, got[0].addr), "a block with a get in flight was handed out"
            assert cache.stats()["pinned_blocks"] == 1 and pool.used == 3 * MIB
            t.wait(30.0)
            back = cache.allocate_on(MIB, 7, 4096)
            assert back.addr == addr, "the block is not reused once the get completed"
            arr = np.from_dlpack(back)
            assert (arr == np.arange(MIB) % 239).all(), "the pulled bytes are not the owner's"
            arr[:4096] = 255 - arr[:4096]
            del arr
            peer.push_from_allocation(back, 0, rng, 0, 4096).wait(30.0)
            peer.release(rng, 30.0)
        out, _ = owner.communicate(timeout=60)
        assert owner.returncode == 0, out
        assert "owner: ok" in out
        for b in (back, same, got[0]):
            b.free()
        assert cache.trim(2**64 - 1) == 3 * MIB
        mgr.poll()
        assert pool.used == 0
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        mine.close()
