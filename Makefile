# The whole set-up is `make serve` and `make test`; everything else is a step of theirs.
PY ?= python3
VENV := .venv
BOOT := .venv-boot
UV := $(BOOT)/bin/uv
UV_VERSION := 0.13.8
STAMP := $(VENV)/.corral-installed
# The kernels' own environment (runtime/requirements.lock), which sandboxes see read-only.
RUNTIME := $(VENV)/kernel-runtime
RUNTIME_STAMP := $(RUNTIME)/.corral-installed
export UV_PYTHON_DOWNLOADS := never
# Trust what the system trusts (a TLS-intercepting proxy's CA included), as pip and curl do;
# uv also honours HTTP(S)_PROXY, ALL_PROXY and NO_PROXY by itself.
export UV_SYSTEM_CERTS := 1

.PHONY: serve test check lint typecheck pytest bench conformance lock clean

serve: $(STAMP) $(RUNTIME_STAMP)
	scripts/install-system-packages || echo "corral: continuing without the optional system packages" >&2
	$(VENV)/bin/corral serve

test: $(STAMP) $(RUNTIME_STAMP) check pytest

check: lint typecheck

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Three workers: most tests wait on kernels and sandboxes rather than compute, so on two
# cores three at a time halve the run (one worker used about 0.3 of a core). The slowest
# tests are listed so that a run near its time budget shows where the time went.
pytest: $(STAMP) $(RUNTIME_STAMP)
	scripts/install-system-packages
	$(VENV)/bin/pytest -n 3 --durations=20

bench: $(STAMP) $(RUNTIME_STAMP)
	$(VENV)/bin/python -m bench

# schemathesis over the whole API, every check and phase, alone (`make test` runs it too).
# CORRAL_CONFORMANCE_SEED=N or =random for another seed than the fixed one.
conformance: $(STAMP) $(RUNTIME_STAMP)
	$(VENV)/bin/pytest -p no:logging tests/server/test_conformance.py

# Re-pin every dependency, the server's and the kernels' (run by hand when pyproject.toml or
# runtime/requirements.in changes, then commit both locks).
lock: $(UV)
	$(UV) pip compile pyproject.toml --group dev --generate-hashes --universal \
		--python-version 3.11 --quiet -o requirements.lock
	$(UV) pip compile runtime/requirements.in --generate-hashes --universal \
		--python-version 3.11 --quiet -o runtime/requirements.lock

$(UV):
	scripts/bootstrap-uv $(PY) $(BOOT) $(UV_VERSION)

$(STAMP): requirements.lock pyproject.toml | $(UV)
	test -x $(VENV)/bin/python || $(UV) venv --quiet --python $(PY) $(VENV)
	$(UV) pip sync --quiet --python $(VENV)/bin/python --require-hashes requirements.lock
	$(UV) pip install --quiet --python $(VENV)/bin/python --no-deps --no-build-isolation -e .
	touch $@

# Made from the server's interpreter, whose prefix the sandbox shows at /opt/corral/python.
# Compiled here: the sandbox sees it read-only, so a kernel could not cache what it compiles
# and would compile every module it imports at every start.
$(RUNTIME_STAMP): runtime/requirements.lock | $(STAMP)
	test -x $(RUNTIME)/bin/python || $(UV) venv --quiet --python $(VENV)/bin/python $(RUNTIME)
	$(UV) pip sync --quiet --compile-bytecode --python $(RUNTIME)/bin/python \
		--require-hashes runtime/requirements.lock
	touch $@

clean:
	rm -rf $(VENV) $(BOOT) .pytest_cache .mypy_cache .ruff_cache
