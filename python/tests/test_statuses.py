"""One status per kind of refusal (docs/CONTRACT.md, "Host statuses"):
size 0 is InvalidArgument through a plain and a caching binding alike, and
load options that name no overlap policy are refused before anything is
loaded."""
import pytest

import memplug


def test_size_zero_is_invalid_argument_everywhere(mgr, ctx, pool):
    for b in (mgr.bind(ctx, pool, "kv"), mgr.bind_caching(ctx, pool, "activations")):
        with pytest.raises(memplug.InvalidArgument) as e:
            b.allocate(0)
        assert e.value.status == "INVALID_ARGUMENT"
        assert "size 0" in str(e.value)
    assert pool.used == 0


def test_load_options_are_checked_before_loading(mgr, tmp_path):
    with pytest.raises(memplug.InvalidArgument, match="check_overlaps"):
        mgr.load_plugin(tmp_path / "libx.so", check_overlaps="sometimes")
    # A valid policy reaches the loader, which refuses the missing file.
    with pytest.raises(memplug.LoadError):
        mgr.load_plugin(tmp_path / "libx.so", check_overlaps="all")
