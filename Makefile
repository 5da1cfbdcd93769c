# Two commands matter: `make run` and `make test`. Each installs what it needs itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

KAFKAJS := tests/conformance/kafkajs

.PHONY: install run test lint bench system-deps java-deps node-deps pipeline-demo clean

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

# Java 17 for Spark (tests/pipeline, pipeline-demo); installed only when missing.
# Slim images lack man1, which the JRE's postinst needs.
java-deps:
	@command -v java >/dev/null 2>&1 || { mkdir -p /usr/share/man/man1; \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless); }

# kafkajs for the conformance suite, pinned by its package-lock.json.
node-deps:
	@if [ -f $(KAFKAJS)/package-lock.json ]; then \
	  [ -d $(KAFKAJS)/node_modules ] && [ $(KAFKAJS)/node_modules -nt $(KAFKAJS)/package-lock.json ] || \
	  npm ci --prefix $(KAFKAJS) --no-audit --no-fund --loglevel=error; fi

test: install system-deps java-deps node-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider

pipeline-demo: install java-deps
	$(BIN)/python -m pipeline.jobs.demo

lint: install
	$(BIN)/ruff check .

# The peer table of docs/benchmarks.md; the other benchmarks: python -m bench.<name> --json.
bench: install
	$(BIN)/python -m bench.peers --json --report

clean:
	rm -rf $(VENV) data
