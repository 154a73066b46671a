# The two commands a newcomer needs: `make demo` and `make test`.  Each sets itself up:
# a virtualenv with whywait and its dev tools, the Kafka jars (Maven Central), a local broker.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-scaleout lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# setuptools notes at every editable install of a mapped layout that a folder named like the package may
	# take precedence in imports (whywait/ is that folder, by design): information, not a problem to show.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/whywait kafka fetch
	$(BIN)/whywait demo

# tests/conftest.py starts a private Kafka broker for the session (or uses WHYWAIT_KAFKA_BOOTSTRAP).
# pytest exits 5 when it collected no tests: that fails this target like any other failure.
# Lint first: a type or style error fails the build before the slower tests run.
# The multi-worker scale-out and failover tests start 2-3 engines each and take about 20 minutes on a 2-core
# machine, so they have their own target; `make test` leaves them out.
test: lint
	$(BIN)/whywait kafka fetch
	$(BIN)/pytest -q -p no:cacheprovider -m "not scaleout" $(PYTEST_ARGS)

test-scaleout: $(STAMP)
	$(BIN)/whywait kafka fetch
	$(BIN)/pytest -q -p no:cacheprovider -m scaleout $(PYTEST_ARGS)

# Every package.  mypy's settings (strict on the pure core) are in pyproject.toml.
PACKAGES := agents engine topology simulate whywait tests setup.py
# mypy cannot follow the package-dir mapping of setup.py (whywait.engine is ./engine), so it reads the package
# through a tree of symlinks laid out as the wheel is: .typecheck/whywait/{engine,agents,...} -> ./engine, ...
lint: $(STAMP)
	$(BIN)/ruff check $(PACKAGES)
	rm -rf .typecheck && mkdir -p .typecheck/whywait
	for f in whywait/*.py; do ln -s ../../$$f .typecheck/whywait/; done
	for d in agents engine topology simulate; do ln -s ../../$$d .typecheck/whywait/$$d; done
	MYPYPATH=.typecheck $(BIN)/mypy -p whywait
	MYPYPATH=.typecheck $(BIN)/mypy tests setup.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .typecheck
