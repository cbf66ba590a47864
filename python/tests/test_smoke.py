def test_import():
    import memplug
    assert memplug.Manager
