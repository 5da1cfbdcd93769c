# Two commands matter: `make run` and `make test`. Each installs what it needs itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

KAFKAJS := tests/conformance/kafkajs

.PHONY: install run test lint bench system-deps node-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	mkdir -p data
	$(BIN)/mini-broker config/server.properties --override log.dirs=./data

# kcat comes from Debian; installed only when missing.
system-deps:
	@command -v kcat >/dev/null 2>&1 || { \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat || \
	   sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat); }

# kafkajs for the conformance suite, pinned by its package-lock.json.
node-deps:
	@if [ -f $(KAFKAJS)/package-lock.json ]; then \
	  [ -d $(KAFKAJS)/node_modules ] && [ $(KAFKAJS)/node_modules -nt $(KAFKAJS)/package-lock.json ] || \
	  npm ci --prefix $(KAFKAJS) --no-audit --no-fund --loglevel=error; fi

test: install system-deps node-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: install
	$(BIN)/ruff check .

bench: install
	@echo "benchmarks: python -m bench.<name> --json (see docs/benchmarks.md)"

clean:
	rm -rf $(VENV) data
