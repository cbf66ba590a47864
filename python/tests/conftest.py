import pytest

import memplug

MIB = 1 << 20


@pytest.fixture
def mgr():
    m = memplug.Manager()
    m.register_cpu_plugin()
    return m


@pytest.fixture
def ctx(mgr):
    return mgr.select("cpu", 0, virtual_backing=True, shared_mapping=True)


@pytest.fixture
def pool(mgr):
    return mgr.create_pool("test", 64 * MIB)
