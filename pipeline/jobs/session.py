"""A local SparkSession that can run the data source: tuned for a small machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import pipeline

ROOT = str(Path(pipeline.__file__).resolve().parents[1])


def local_session(master: str = "local[*]", app: str = "mini-broker-pipeline",
                  **conf: str) -> SparkSession:
    """Spark's Python workers are separate processes started by the JVM; they import
    `pipeline` to unpickle the data source, so the checkout goes on their PYTHONPATH (on a
    cluster, ship it with --py-files or a wheel instead)."""
    # Workers must run this interpreter (its venv holds confluent-kafka), not `python3` on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    path = os.environ.get("PYTHONPATH", "")
    if ROOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, path) if p)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Stay on loopback: the machine's outward address may not even be routable.
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    pipeline.register(spark)
    return spark
