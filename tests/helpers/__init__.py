"""What the tests share: one module per kind of thing (paths, HTTP, waiting, fake servers, tiny
models, harnesses that drive real processes). Importable as `helpers.*` (pytest.ini: pythonpath = tests);
fixtures live in tests/conftest.py."""
