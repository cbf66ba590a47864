"""A toy LLM decode loop on memplug memory, seen through NumPy.

* Weights: "experts" loaded under a 24 MiB budget by a holder that evicts
  the least recently used ones when another allocation needs room.
* A system prompt's KV rows, computed once into a shared prefix, mapped
  read-only at the start of every request's KV region (charged once).
* Each request's KV cache is a region that grows a block at a time at a
  stable base; every step sees its rows as a float32 array (rows x
  width) through DLPack, without a copy: the whole region read-only (it
  starts with the shared prefix), its own rows writable. The update callback
  checks the base (a runtime would write its block table there).
* A request that asks for more than the budget gets OutOfBudget, and its
  grow is rolled back.

Run: python examples/python/kv_cache.py (after `pip install` of the wheel).
"""
import numpy as np

import memplug

MIB = 1 << 20
WIDTH = 1024  # float32 per KV row: 4 KiB a token
ROW = WIDTH * 4
BLOCK = 256 * ROW  # 1 MiB: the region grows a block (256 tokens) at a time
PREFIX_TOKENS = 256


def main():
    mgr = memplug.Manager()
    mgr.register_cpu_plugin()
    ctx = mgr.select("cpu", virtual_backing=True, shared_mapping=True)
    pool = mgr.create_pool("device", 24 * MIB)

    # Weights, evictable under pressure, least recently used first.
    experts = []
    evicted = []

    def evict(ticket):
        freed = 0
        while experts and freed < ticket["bytes_wanted"]:
            name, a = experts.pop(0)
            freed += a.size
            a.free()
            evicted.append(name)
        return freed

    weights_holder = pool.register_holder("weights", evict, priority=1)
    weights = mgr.bind(ctx, pool, "weights", holder=weights_holder)
    for i in range(12):
        a = weights.allocate(MIB)
        np.from_dlpack(a.view(WIDTH * 256, "float32"))[:] = i  # "load" expert i
        experts.append((f"expert{i}", a))

    # The system prompt's KV, shared by every request, read-only in each.
    kv = mgr.bind(ctx, pool, "kv")
    prompt_kv = np.arange(PREFIX_TOKENS * WIDTH, dtype=np.float32)
    prefix = kv.create_shared(PREFIX_TOKENS * ROW, prompt_kv.tobytes())
    used_before = pool.used

    requests = []
    for req in range(2):
        region = kv.reserve(64 * MIB)  # address space for the longest sequence
        region.map_prefix(prefix)
        requests.append(region)

    def check_base(region):
        def update(addr, length):
            if addr != region.addr:
                raise RuntimeError("the base moved")
        return update

    tokens = [0, 0]
    steps = 8 * 256
    for step in range(steps):
        for i, region in enumerate(requests):
            pos = PREFIX_TOKENS + tokens[i]
            if (pos + 1) * ROW > region.len:
                region.grow_to(region.len + BLOCK, check_base(region))  # may evict experts
            # The request's own rows, after the read-only prefix.
            own = np.from_dlpack(region.view((tokens[i] + 1, WIDTH), "float32", offset=PREFIX_TOKENS * ROW))
            assert own.ctypes.data == region.addr + PREFIX_TOKENS * ROW  # the same memory every step
            own[tokens[i], :] = step + i  # this token's KV row
            tokens[i] += 1
    for i, region in enumerate(requests):
        # The prompt's rows are the shared prefix, mapped read-only: NumPy
        # honours DLPack's read-only flag, so it may share them zero-copy.
        cache = np.from_dlpack(region.view((PREFIX_TOKENS + tokens[i], WIDTH), "float32", on_read_only="share"))
        assert not cache.flags.writeable  # it starts with the shared prefix
        assert np.array_equal(cache[:PREFIX_TOKENS].ravel(), prompt_kv)
        assert cache[-1, 0] == steps - 1 + i
        private = np.from_dlpack(region.view((tokens[i], WIDTH), "float32", offset=PREFIX_TOKENS * ROW))
        assert private.flags.writeable

    # A long prompt that does not fit: refused, nothing changed.
    greedy = kv.reserve(64 * MIB)
    try:
        greedy.grow_to(32 * MIB)
        raise AssertionError("a 32 MiB grow fit a 24 MiB pool")
    except memplug.OutOfBudget as e:
        print(f"refused: {e.requested // MIB} MiB asked, {e.used // MIB} of {e.capacity // MIB} MiB used")
    assert greedy.len == 0

    s = pool.stats()
    print(f"evicted {len(evicted)} experts ({', '.join(evicted)})")
    print(f"pool: {s['used'] // MIB} MiB used of {s['capacity'] // MIB}, peak {s['peak'] // MIB} MiB; "
          f"kv {s['classes']['kv'] // MIB} MiB, weights {s['classes']['weights'] // MIB} MiB; "
          f"prefix charged once: {prefix.charged // MIB} MiB")
    assert evicted, "the KV growth pushed weights out"
    assert s["peak"] <= s["capacity"]
    assert used_before >= prefix.charged
    for region in requests + [greedy]:
        region.close()
    for _, a in experts:
        a.free()
    weights_holder.unregister()
    del cache, private, own, prefix
    import gc

    gc.collect()
    assert pool.used == 0, pool.used
    print("kv_cache.py: ok")


if __name__ == "__main__":
    main()
