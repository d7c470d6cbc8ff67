"""dask's own contract for scheduler ``get`` functions, run against ``cluster.get``.

``dask.utils_test.GetFunctionTestMixin`` is what dask ships for foreign schedulers: a list
of keys comes back as a tuple (nested lists as nested tuples), a key that is not in the
graph raises ``KeyError``, literal lists, nested tasks and deep chains work.
"""

from __future__ import annotations

import pytest
from dask.utils_test import GetFunctionTestMixin

pytestmark = pytest.mark.taskvine


class TestClusterGet(GetFunctionTestMixin):
    @pytest.fixture(autouse=True)
    def _cluster_get(self, cluster: object) -> None:
        self.get = cluster.get  # type: ignore[attr-defined]
