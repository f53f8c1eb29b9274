# Every target creates .venv/ from requirements.lock when it is missing.
PY        ?= python3.11
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
DS        ?= 2026-11-28
SEED      ?= 7
ROLLOUTS  ?= 240
# The other Pythons the package supports: the install from requirements.lock, then the core's
# tests (no Airflow service, browser or Celery cluster), each in .venv-<version>/ (`.ci/run`)
PYTHONS   ?= 3.12 3.13
AIRFLOW_TESTS := test_celery test_dag test_demo test_gym_envelope_dag test_quality_ui test_report_page \
                 test_scheduler test_verifiers_dag
.PHONY: venv run test test-core test-pythons test-install lint bench airflow airflow-celery airflow-stop lock clean

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	DS=$(DS) SEED=$(SEED) ROLLOUTS=$(ROLLOUTS) bash scripts/make_run.sh

test: lint
	$(BIN)/python -m pytest -q -n auto --dist loadfile

test-core: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile -p no:cacheprovider $(foreach t,$(AIRFLOW_TESTS),--ignore=tests/$(t).py)

test-pythons:
	@for v in $(PYTHONS); do \
	  py="$$(bash scripts/find_python.sh $$v)" || exit 1; \
	  echo "== Python $$v ($$py): install from requirements.lock, then the core's tests"; \
	  $(MAKE) --no-print-directory PY="$$py" VENV=.venv-$$v test-core || exit 1; \
	done

# The wheel installed into an Airflow 3.2 image (tests/install/) and alone, from PyPI (.ci/run)
test-install: $(STAMP)
	REASSEMBLER_INSTALL_TESTS=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_install.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

airflow: $(STAMP)
	bash scripts/airflow_services.sh start

airflow-celery: $(STAMP)
	bash scripts/airflow_celery.sh start

airflow-stop:
	bash scripts/airflow_services.sh stop

bench: $(STAMP)
	$(BIN)/python scripts/benchmark.py

lock:
	rm -rf /tmp/reassembler-lock && $(PY) -m venv /tmp/reassembler-lock
	/tmp/reassembler-lock/bin/pip install --quiet "apache-airflow==3.3.2" "duckdb==2.0.0" "pyarrow==26.0.1" "numpy>=2.4,<2.5" "orjson==3.13.0" "plotly==7.1.0" datasets polars playwright ruff mypy pytest hypothesis pytest-timeout "setuptools==80.9.0" wheel botocore "python-dateutil<3" "moto[server]" "apache-airflow-providers-celery==3.26.0" "celery<5.7" redis psycopg2-binary asyncpg
	{ echo "# Fully pinned environment for the reassembler (Python 3.11). Regenerate with: make lock"; \
	  /tmp/reassembler-lock/bin/pip freeze --all | grep -v "^pip=="; } > requirements.lock

clean:
	rm -rf $(VENV) .venv-3.* .airflow data
