"""One budget across processes from Python: an authority embedded in this
process, a child Python process whose cached KV blocks (declared as its
only class) give way to this process's allocations through cross-process
tickets: first of another class (classes order tickets, they never
exclude), then of KV."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import memplug
import pytest

MIB = 1 << 20

CHILD = textwrap.dedent(
    """
    import sys, threading
    import memplug
    MIB = 1 << 20
    mgr = memplug.Manager()
    mgr.register_cpu_plugin()
    ctx = mgr.select("cpu", 0)
    pool = mgr.create_pool("cpu0", 0)
    lock = threading.Lock()
    cached = []
    def evict(ticket):
        freed = 0
        with lock:
            while cached and freed < ticket["bytes_wanted"]:
                victim = cached.pop(0)
                freed += victim.size
                victim.free()
        return freed
    holder = pool.register_holder("lru", evict)
    link = mgr.join_node(sys.argv[1], pool, "cpu0", classes=["kv"])
    b = mgr.bind(ctx, pool, "kv", holder=holder, wait=3.0)
    for _ in range(12):
        a = b.allocate(MIB)
        with lock:
            cached.append(a)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def test_a_child_process_gives_way_through_the_node():
    sock = os.path.join(tempfile.mkdtemp(), "node.sock")
    authority = memplug.NodeAuthority(sock, {"cpu0": 16 * MIB}, chunk=MIB, ticket_timeout=2.0)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        mgr = memplug.Manager()
        mgr.register_cpu_plugin()
        ctx = mgr.select("cpu", 0)
        pool = mgr.create_pool("cpu0", 0)
        link = mgr.join_node(sock, pool, "cpu0", priority=5)
        assert link.connected and link.chunk == MIB
        # Activations: the child declared KV only, and is asked all the
        # same (nobody holds activations; any memory serves any request).
        act = mgr.bind(ctx, pool, "activations", wait=5.0).allocate(6 * MIB)
        theirs = [m for m in json.loads(authority.status())["members"] if m["pid"] == child.pid][0]
        assert theirs["classes"] == {"cpu0": ["kv"]} and theirs["tickets_received"] >= 1, theirs
        act.free()
        with pytest.raises(Exception, match="unknown allocation class"):
            mgr.join_node(sock, mgr.create_pool("cpu0-bad", 0), "cpu0", classes=["kvv"])
        big = mgr.bind(ctx, pool, "kv", wait=5.0).allocate(8 * MIB)
        mine = link.stats()
        assert mine["connected"] and mine["joins"] == 1 and mine["held"] >= 8 * MIB, mine
        assert mine["leases_granted"] >= 1 and mine["bytes_leased"] >= 8 * MIB, mine
        books = json.loads(authority.status())
        assert books["books_exact"] is True
        assert books["devices"]["cpu0"]["leased"] <= 16 * MIB
        theirs = [m for m in books["members"] if m["pid"] == child.pid][0]
        assert theirs["tickets_answered"] >= 1 and theirs["bytes_released"] >= 4 * MIB, theirs
        big.free()
        link.close()
    finally:
        child.communicate("", timeout=30)
        authority.close()
    assert child.returncode == 0
