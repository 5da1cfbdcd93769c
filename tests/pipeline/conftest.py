"""Spark for the pipeline tests: one local[2] session for the run, a real broker per test.

PySpark and Java are requirements of `make test`, not options: when either is missing the
tests fail and say how to get them, rather than skip and let the pipeline go untested.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_HOW = "`make test` installs it (pip: pyspark, pyarrow, pandas; Debian: openjdk-17-jre-headless)"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    try:
        import pyarrow  # noqa: F401  (the Python data source moves rows as Arrow batches)
        import pyspark  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the pipeline tests need PySpark 4 and pyarrow ({exc}); {_HOW}",
                    pytrace=False)
    if shutil.which("java") is None:
        pytest.fail(f"the pipeline tests need Java 17 for Spark; {_HOW}", pytrace=False)
    from pipeline.jobs.session import local_session

    session = local_session("local[2]", "mini-broker-pipeline-tests")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_query_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """The session is shared, so a streaming query a test leaves running is stopped here."""
    yield
    if "spark" in request.fixturenames:
        for query in request.getfixturevalue("spark").streams.active:
            query.stop()
