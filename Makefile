# The two commands a newcomer needs: `make demo` and `make test`.  Each sets itself up:
# a virtualenv with whywait and its dev tools, the Kafka jars (Maven Central), a local broker.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/whywait kafka fetch
	$(BIN)/whywait demo

# tests/conftest.py starts a private Kafka broker for the session (or uses WHYWAIT_KAFKA_BOOTSTRAP).
# pytest exits 5 when it collected no tests: that fails this target like any other failure.
test: $(STAMP)
	$(BIN)/whywait kafka fetch
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check agents engine topology tests
	$(BIN)/mypy agents/events.py engine/rules engine/evaluate engine/diagnosis.py engine/stream engine/replay.py simulate/ruletest.py engine/commands topology

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
