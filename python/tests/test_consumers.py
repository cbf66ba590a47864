"""Views of read-only memory (a shared prefix mapped read-only) handed to
real consumers: NumPy, PyTorch, JAX. No consumer, honouring DLPack's
read-only flag or not, may crash the process by writing through a view:
by default such a view is refused, `on_read_only="share"` hands it out
zero-copy and flagged (NumPy honours it), `on_read_only="copy"` (or the
consumer's `copy=True`) hands out a private, writable copy.

PyTorch ignores the flag, so what it does with a view runs in a child
interpreter: a crash is then a failed test, not a dead pytest. Tests of a
consumer that is not installed are skipped, saying which
(`MEMPLUG_PYTHON_CONSUMERS=1 scripts/python-test.sh` installs them)."""
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import memplug
from conftest import MIB

PROMPT = b"You are a helpful assistant."

# The same setup, for a child interpreter: a region whose first MiB is the
# shared prefix, mapped read-only, and one private MiB after it.
SETUP = textwrap.dedent(
    """
    import memplug
    MIB = 1 << 20
    mgr = memplug.Manager()
    mgr.register_cpu_plugin()
    ctx = mgr.select("cpu", 0, virtual_backing=True, shared_mapping=True)
    pool = mgr.create_pool("test", 64 * MIB)
    kv = mgr.bind(ctx, pool, "kv")
    prefix = kv.create_shared(MIB, %r)
    r = kv.reserve(16 * MIB)
    r.map_prefix(prefix)
    r.grow_to(len(prefix) + MIB)
    assert r.prefix_is_read_only
    """
    % PROMPT
)


@pytest.fixture
def region(mgr, ctx, pool):
    kv = mgr.bind(ctx, pool, "kv")
    prefix = kv.create_shared(MIB, PROMPT)
    r = kv.reserve(16 * MIB)
    r.map_prefix(prefix)
    r.grow_to(len(prefix) + MIB)
    assert r.prefix_is_read_only
    return r


def run_child(body):
    """Runs SETUP then `body` in a new interpreter; returns (returncode,
    output). A negative returncode is the signal that killed it."""
    p = subprocess.run(
        [sys.executable, "-c", SETUP + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return p.returncode, p.stdout + p.stderr


def prompt_bytes(r):
    return bytes(np.from_dlpack(r.view(len(PROMPT), on_read_only="share")))


# --------------------------------------------------------------------------
# The policy, through NumPy (always installed)
# --------------------------------------------------------------------------


def test_read_only_views_are_refused_by_default_saying_what_to_do(region):
    for view in (region, region.view(16), region.view((4, 4), "float32", offset=64)):
        with pytest.raises(BufferError) as e:
            np.from_dlpack(view)
        msg = str(e.value)
        for want in ("read-only", "on_read_only='copy'", "on_read_only='share'", "PyTorch", "copy=True"):
            assert want in msg, f"{want!r} missing from: {msg}"
    # Private bytes after the prefix are ordinary memory.
    private = np.from_dlpack(region.view(16, offset=MIB))
    assert private.flags.writeable and private.ctypes.data == region.addr + MIB


def test_share_is_zero_copy_and_read_only_for_numpy(region):
    v = region.view(len(PROMPT), on_read_only="share")
    assert v.on_read_only == "share"
    arr = np.from_dlpack(v)
    assert arr.ctypes.data == region.addr, "zero-copy"
    assert not arr.flags.writeable and bytes(arr) == PROMPT
    with pytest.raises(ValueError):
        arr[0] = 1


def test_copy_is_private_writable_and_uncharged(region, pool):
    used = pool.used
    arr = np.from_dlpack(region.view(len(PROMPT), on_read_only="copy"))
    assert arr.flags.writeable and arr.ctypes.data != region.addr
    assert bytes(arr) == PROMPT
    arr[:3] = 0
    assert prompt_bytes(region) == PROMPT, "the prefix is untouched"
    assert pool.used == used, "a copy is not charged to the pool"
    assert region.views == 0, "a copy does not hold the region"
    # Strided and offset views copy what they show.
    t = np.from_dlpack(region.view((2, 4), "uint8", strides=[1, 2], on_read_only="copy"))
    assert t.tolist() == [[PROMPT[i + 2 * j] for j in range(4)] for i in range(2)]


def test_consumer_copy_true_and_false(region):
    arr = np.from_dlpack(region.view(8), copy=True)
    assert arr.flags.writeable and bytes(arr) == PROMPT[:8]
    with pytest.raises(BufferError, match="copy=False"):
        region.view(8, on_read_only="copy").__dlpack__(max_version=(1, 0), copy=False)
    with pytest.raises(BufferError):
        region.view(8).__dlpack__(max_version=(1, 0), copy=False)


def test_bad_choice_is_named():
    m = memplug.Manager()
    m.register_cpu_plugin()
    a = m.bind(m.select("cpu"), m.create_pool("p", 8 * MIB)).allocate(MIB)
    with pytest.raises(ValueError, match="refuse.*share.*copy"):
        a.view(16, on_read_only="yes")


# --------------------------------------------------------------------------
# PyTorch: ignores the read-only flag
# --------------------------------------------------------------------------

torch_present = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="PyTorch is not installed (MEMPLUG_PYTHON_CONSUMERS=1 scripts/python-test.sh installs it)",
)


@torch_present
def test_torch_writes_never_crash():
    code, out = run_child(
        """
        import torch
        try:
            torch.from_dlpack(r.view(16))
            raise SystemExit("a read-only view went to torch by default")
        except BufferError as e:
            assert "on_read_only" in str(e), e
        t = torch.from_dlpack(r.view(len(prefix), on_read_only="copy"))
        t[0] = 7                      # lands in the copy
        t2 = torch.from_dlpack(r.view(16), copy=True)
        t2 += 1
        w = torch.from_dlpack(r.view(4, "float32", offset=MIB))
        w[0] = 2.5                    # private bytes: shared with the region
        import numpy as np
        assert bytes(np.from_dlpack(r.view(3, on_read_only="share"))) == b"You"
        assert np.from_dlpack(r.view(1, "float32", offset=MIB))[0] == 2.5
        assert int(t[0]) == 7 and int(t[1]) == ord("o")
        print("torch: ok")
        """
    )
    assert code == 0 and "torch: ok" in out, f"exit {code}:\n{out}"


@torch_present
def test_the_child_would_see_a_crash():
    """What the test above guards against: torch ignores the flag, so a
    write through a shared view faults. Proves a crash is observed."""
    code, out = run_child(
        """
        import torch
        t = torch.from_dlpack(r.view(16, on_read_only="share"))
        print("a writable tensor over read-only pages", flush=True)
        t[0] = 1
        print("survived")
        """
    )
    assert code == -signal.SIGSEGV, f"exit {code}:\n{out}"
    assert "survived" not in out


# --------------------------------------------------------------------------
# JAX: asks for the legacy capsule (stream=None, no max_version)
# --------------------------------------------------------------------------

jax_present = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import jax"], capture_output=True).returncode != 0,
    reason="JAX is not installed (MEMPLUG_PYTHON_CONSUMERS=1 scripts/python-test.sh installs it)",
)


@jax_present
def test_jax_gets_a_copy_or_a_message_it_can_follow():
    code, out = run_child(
        """
        import jax.numpy as jnp
        for view, want in ((r.view(16), "on_read_only='copy'"),
                           (r.view(16, on_read_only="share"), "legacy")):
            try:
                jnp.from_dlpack(view)
                raise SystemExit("JAX got read-only memory it cannot be told about")
            except BufferError as e:
                assert want in str(e) and "JAX" in str(e), e
        x = jnp.from_dlpack(r.view(len(prefix), on_read_only="copy"))
        assert bytes(x.tobytes()[:3]) == b"You"
        y = jnp.from_dlpack(r.view(4, "float32", offset=MIB))   # private bytes, zero-copy
        print("jax: ok", y.shape)
        """
    )
    assert code == 0 and "jax: ok" in out, f"exit {code}:\n{out}"
