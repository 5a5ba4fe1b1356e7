"""The shared store contract lives outside test modules: have pytest rewrite its asserts too."""

import pytest

pytest.register_assert_rewrite("tests.analytics.store_contract", "tests.analytics.analytics_helpers")
