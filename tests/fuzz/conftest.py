"""Fixtures of the fuzz suite: the capture-proxy tests' tiny model, codec and in-process native engine."""

from tests.adapter.conftest import _one_thread, codec, engine_a, tiny_model_dir  # noqa: F401  (fixtures)
