"""Streams and fences on the CPU plugin's sync capability: Python host
functions on a stream's worker, recorded and runtime fences, frees behind
fences, stream-ordered cache reuse, queued grows, and DLPack exports that
wait for the stream work that last used the memory."""
import ctypes
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import memplug
from conftest import MIB


@pytest.fixture
def stream(ctx):
    with ctx.create_stream() as s:
        yield s


def gate(stream):
    """Blocks `stream` until the returned event is set."""
    ev = threading.Event()
    stream.enqueue(lambda: ev.wait(10))
    return ev


def test_host_function_writes_and_the_fence_after_it_completes_after_it(mgr, ctx, pool, stream):
    a = mgr.bind(ctx, pool).allocate(4096)
    raw = (ctypes.c_uint32 * 1024).from_address(a.addr)
    order = []

    def work():
        time.sleep(0.2)
        raw[0] = 0xC0FFEE
        order.append(("wrote", threading.get_ident()))

    stream.enqueue(work)
    f = stream.record_fence()
    assert not f.query(), "the fence waits for the host function before it"
    assert f.wait(5)
    assert order and order[0][1] != threading.get_ident(), "it ran on the stream's worker"
    assert raw[0] == 0xC0FFEE
    assert f.query()


def test_host_function_exception_is_unraisable_and_the_stream_goes_on(stream, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    ran = []

    def boom():
        raise RuntimeError("host function failed")

    stream.enqueue(boom)
    stream.enqueue(lambda: ran.append(1))
    assert stream.synchronize(5)
    assert ran == [1], "work after the failing function still ran"
    assert len(seen) == 1 and str(seen[0]) == "host function failed"


def test_dlpack_to_the_cpu_waits_for_the_stream_work_that_used_the_memory(mgr, ctx, pool, stream):
    a = mgr.bind(ctx, pool).allocate(4096)
    raw = (ctypes.c_uint32 * 1024).from_address(a.addr)

    def late_write():
        time.sleep(0.3)
        raw[5] = 77

    stream.enqueue(late_write)
    a.used_by(stream.record_fence())
    arr = np.from_dlpack(a.view(1024, "uint32"))
    assert arr[5] == 77, "the export waited for the stream's write (kDLCPU: synchronise)"
    with pytest.raises(BufferError, match="only stream=None"):
        a.__dlpack__(max_version=(1, 0), stream=5)


def test_a_host_function_never_waits_for_its_own_streams_later_fence(mgr, ctx, pool, stream, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    buf = mgr.bind(ctx, pool).allocate(4096)
    ev = gate(stream)
    stream.enqueue(lambda: np.from_dlpack(buf).fill(9))  # exports under a later use
    later = stream.record_fence()
    buf.used_by(later)
    box = []
    stream.enqueue(lambda: box[0].wait())  # a fence recorded after this function
    box.append(stream.record_fence())
    ev.set()
    assert stream.synchronize(5), "neither the export nor the wait hung the stream"
    assert np.from_dlpack(buf)[0] == 9
    assert len(seen) == 1 and isinstance(seen[0], memplug.InvalidState)


def test_free_after_keeps_the_charge_until_the_runtime_fence_completes(mgr, ctx, pool):
    b = mgr.bind(ctx, pool)
    done = [False]
    fence = mgr.fence_from(lambda: done[0], name="step 7")
    assert "step 7" in repr(fence) and not fence.query()

    a = b.allocate(MIB)
    a.free_after([fence])
    assert a.freed
    mgr.poll()
    assert pool.used == MIB, "the runtime may still use it"

    # Shared with a live export: freed once the fence completed and the
    # array let go, in either order.
    c = b.allocate(MIB)
    arr = np.from_dlpack(c.view(MIB))
    c.free_after([fence])
    done[0] = True
    mgr.poll()
    assert pool.used == MIB, "the first is freed; the array keeps the second"
    del arr
    assert pool.used == 0
    with pytest.raises(memplug.InvalidState):
        a.free_after([fence])


def test_a_raising_runtime_fence_counts_as_not_done(mgr, ctx, pool, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    state = {"raise": True}

    def query():
        if state["raise"]:
            raise ValueError("runtime query failed")
        return True

    f = mgr.fence_from(query)
    mgr.bind(ctx, pool).allocate(MIB).free_after([f])
    mgr.poll()
    assert pool.used == MIB and seen, "never freed on a guess"
    state["raise"] = False
    mgr.poll()
    assert pool.used == 0


def test_free_waits_for_uses_recorded_on_a_stream(mgr, ctx, pool, stream):
    a = mgr.bind(ctx, pool).allocate(MIB)
    ev = gate(stream)
    a.used_by(stream.record_fence())
    a.free()
    mgr.poll()
    assert pool.used == MIB
    ev.set()
    assert stream.synchronize(5)
    mgr.poll()
    assert pool.used == 0


def test_stream_ordered_cache_reuse(mgr, ctx, pool, stream):
    c = mgr.bind_caching(ctx, pool, "workspace")
    ev = gate(stream)
    a = c.allocate_on(MIB, stream)
    addr = a.addr
    a.free_on(stream, stream.record_fence())
    b = c.allocate_on(MIB, stream)
    assert b.addr == addr, "the same stream reuses the block before its fence completed"
    b.free()
    other = c.allocate(MIB)
    assert other.addr != addr, "unordered work does not get a block the stream may still use"
    ev.set()
    assert stream.synchronize(5)
    other.free()

    # A runtime's own stream, named by an int handle.
    done = [False]
    f = mgr.fence_from(lambda: done[0])
    r = c.allocate_on(2 * MIB, 7)
    raddr = r.addr
    r.free_on(7, f)
    again = c.allocate_on(2 * MIB, 7)
    assert again.addr == raddr
    again.free_on(7, f)
    assert c.allocate_on(2 * MIB, 8).addr != raddr, "another stream waits for the fence"
    assert c.stats()["hits"] >= 2
    with pytest.raises(memplug.InvalidArgument):
        c.allocate_on(MIB, "stream 7")


def test_grow_on_queues_the_commit_and_exports_wait_for_it(mgr, ctx, pool, stream):
    r = mgr.bind(ctx, pool, "kv").reserve(16 * MIB)
    ev = gate(stream)
    f = r.grow_on(2 * MIB, stream)
    assert not f.query(), "the commit waits behind the gate"
    assert r.committed == 2 * MIB and pool.used == 2 * MIB, "charged at once"
    threading.Timer(0.2, ev.set).start()
    arr = np.from_dlpack(r.view(2 * MIB))  # waits for the commit's fence
    assert f.query()
    arr[:] = 3
    assert arr.sum() == 6 * MIB


def test_a_stream_waits_for_another_streams_fence(ctx, stream, mgr):
    with ctx.create_stream() as second:
        ev = gate(stream)
        second.wait_fence(stream.record_fence())
        ran = []
        second.enqueue(lambda: ran.append(1))
        after = second.record_fence()
        assert not after.wait(0.2) and not ran
        ev.set()
        assert after.wait(5) and ran == [1]
        with pytest.raises(memplug.InvalidArgument):
            second.wait_fence(mgr.fence_from(lambda: True))


def test_adoption_close_and_refusals(ctx, mgr):
    with pytest.raises(memplug.Unsupported):
        ctx.adopt_stream(0, "cuda")  # the CPU plugin adopts no native stream
    s = ctx.create_stream()
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(memplug.InvalidState):
        s.record_fence()
    with pytest.raises(memplug.InvalidState):
        s.enqueue(lambda: None)


EXIT_SCRIPT = """
import time, memplug
m = memplug.Manager(); m.register_cpu_plugin()
ctx = m.select("cpu")
s = ctx.create_stream()
for _ in range(50):
    s.enqueue(lambda: time.sleep(0.01))
f = m.fence_from(lambda: False)
pool = m.create_pool("p", 1 << 24)
m.bind(ctx, pool).allocate(1 << 20).free_after([f])
print("exiting")
"""


def test_interpreter_exit_with_host_functions_pending():
    p = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "exiting" and "Fatal" not in p.stderr
