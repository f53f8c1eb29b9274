"""capture_rows_nightly: one night of agent capture -> verified training rows + an audit table.

Runs every day at 02:00 UTC for the previous day's partition (ds = logical date - 1 day;
the `ds` param overrides it for manual runs and backfills).

    check_input -> wait_for_input -> plan_load -> load_part[part 0..P-1]
        -> merge_rollouts -> merge_keys[bucket 0..B-1] -> merge_bucket[bucket 0..B-1] -> load_ledger
        -> reassemble[shard 0..K-1] -> audit_checks -> publish -> quality_report -> quality_gate

- check_input:    resolve ds, the output root and the night's input locations (the layout
                  and templates: reassembler/formats/locations.py).
- wait_for_input: a rescheduling sensor: waits (holding no worker slot) until the night's
                  input locations, and the completion marker if one is configured, exist
                  (NeMo Gym's layout: until its results file is whole); fails after
                  `input_wait_hours`.
- plan_load:      cut the night's input files into P load parts (the `load_parts` param,
                  else one per 256 MiB) and write the cut into the run's folder.
- load_part:      mapped over the parts, on any worker: parse and check a part's files into
                  Parquet in the run's folder (no warehouse); a retried part is rewritten whole.
- merge_rollouts: the merge's global step, on any worker: what needs every rollout at once
                  (repeated ids, captures, numbering, shard ranges), over rollout keys only.
- merge_keys:     mapped over B buckets of staging keys, on any worker: token rows found by
                  the calls that ask for them, and those none asks for.
- merge_bucket:   mapped over B buckets of rollouts, on any worker: the bucket's per-call
                  tables as Parquet beside the warehouse, and its shard plan pieces (the
                  `merge_buckets` param; reassembler/merge/).
- load_ledger:    commit the night into the DuckDB warehouse (its rollouts and shard ranges,
                  and which run's per-call files it reads; idempotent: a rerun replaces the
                  night) and write each shard's rollouts: nothing here grows with the calls.
- reassemble:     ReassembleOperator, mapped over the shards; each sorts its calls out of
                  the buckets' pieces, streams them joined with the token Parquet and stages
                  rows and audit files.
- audit_checks:   SQL checks on the staged night (rollouts in = audit rows, ok rollouts =
                  distinct rollouts in rows, mask rate under the limit).
- publish:        commit the night with one manifest (_published/ds=<ds>.json), bring the rows
                  and audit partitions and the warehouse to it, and emit the rows Asset
                  (partition key = ds) with counts, mask reasons and the manifest in its extra.
- quality_report: write the night's capture-quality report and the index over all nights.
- quality_gate:   check the alert thresholds (gate_* params), record the verdict, and fail
                  listing every breach, so the deployment's failure alerts fire; the rows
                  stay published.

The warehouse has one writer: the tasks that open it take slots of the pool named by
`REASSEMBLER_WAREHOUSE_POOL` when the deployment made one, else wait for the warehouse's
locks, and run on the Celery queue `REASSEMBLER_WAREHOUSE_QUEUE` (default: `default`), which
one worker, the one holding the DuckDB file, serves (plugins/reassembler_airflow/warehouse.py).
The load parts and the shards open no warehouse: they read the input and the output store
and run on any worker. A night waiting for its input blocks nobody either way.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import Asset, Param, PokeReturnValue, Variable, dag, task

from reassembler.settings import DS_PATTERN, dag_params, parse_ds, thresholds_from_params
from reassembler_airflow import DAG_ID
from reassembler_airflow.connections import DEFAULT_CONN_ID, use_connection
from reassembler_airflow.failures import task_errors
from reassembler_airflow.operators import ReassembleOperator
from reassembler_airflow.warehouse import reader, task_settings, warehouse_pool, writer

# without REASSEMBLER_INPUT / _OUTPUT (or the Variables): folders under AIRFLOW_HOME
HOME = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()
DEFAULT_INPUT = os.environ.get("REASSEMBLER_INPUT") or str(HOME / "reassembler" / "input")
DEFAULT_OUTPUT = os.environ.get("REASSEMBLER_OUTPUT") or str(HOME / "reassembler" / "output")
# The rows Asset: one identity whatever the output setting, so that changing the output on a
# running deployment never turns the asset a run was parsed with into an inactive one (publish
# would fail at the very end). Where a night's rows are is each event's extra (partition,
# manifest); downstream DAGs schedule on Asset("capture_rows").
ROWS_ASSET = Asset(name="capture_rows", uri="reassembler://capture_rows/")
# A demo deployment's night (make airflow: the night `make run` writes), built by a run
# triggered with the form's defaults; production leaves it unset. Scheduled runs always
# build the day before their logical date.
DEFAULT_DS = os.environ.get("REASSEMBLER_DEFAULT_DS") or None
POOL = warehouse_pool()  # None: the tasks wait for the warehouse's locks instead
# how long wait_for_input waits by default (the param overrides it); the demo sets 0: a
# scheduled night whose input cannot come says so at once (scripts/airflow_services.sh)
INPUT_WAIT_HOURS = float(os.environ.get("REASSEMBLER_INPUT_WAIT_HOURS", "6"))
LAYOUT_OF_DEPLOYMENT = "deployment"  # the layout param's default: REASSEMBLER_LAYOUT, else contract
READER, WRITER = reader(POOL), writer(POOL)
POKE_SECONDS = float(os.environ.get("REASSEMBLER_INPUT_POKE_SECONDS", "300"))  # how often wait_for_input looks
# how long a local NeMo Gym results file must be unchanged to count as written (formats/night.py)
SETTLE_SECONDS = float(os.environ.get("REASSEMBLER_INPUT_SETTLE_SECONDS", "30"))


def _setting(name: str, default: str | None) -> str | None:
    """Airflow Variable reassembler_<name>, else the environment, else the repo default."""
    return Variable.get(f"reassembler_{name}", default=None) or default


def _location_param(kind: str, what: str) -> Param:
    several = kind == "rollouts"  # a list: a night read from several locations (Gym results, verifiers traces)
    return Param(
        None,
        type=["null", "string", "array"] if several else ["null", "string"],
        **({"items": {"type": "string"}} if several else {}),
        description=f"Where {what} of the night are, instead of the layout's (REASSEMBLER_{kind.upper()}, or the "
        f"Variable reassembler_{kind}): a folder, a file or a glob, local or s3://, with {{ds}}, {{yyyy}}, {{mm}}, "
        "{dd} and {input} filled from the night"
        + ("; a list of them reads every one as one night (the setting: a JSON list)" if several else "")
        + ". Empty: the deployment's setting, else the layout's.",
    )


# every param a run takes; a triggered run's conf naming another key fails (unknown_conf)
PARAMS = {
    "ds": Param(
        None,
        type=["null", "string"],
        format="date",  # a date that exists: the trigger form refuses 2026-02-30
        pattern=DS_PATTERN,
        description="Night to build (YYYY-MM-DD). Empty: the day before the run's logical date"
        + (
            f"; a run triggered by hand builds {DEFAULT_DS}, this deployment's demo night (REASSEMBLER_DEFAULT_DS)."
            if DEFAULT_DS
            else "."
        ),
    ),
    # the params Settings owns (reassembler/settings.py): defaults, ranges and enums from there
    **{name: Param(**spec) for name, spec in dag_params().items()},
    "input_wait_hours": Param(
        INPUT_WAIT_HOURS,
        type="number",
        minimum=0,
        description="How long wait_for_input waits for the night's input before failing "
        "(REASSEMBLER_INPUT_WAIT_HOURS; 0: fail at once when it is missing).",
    ),
    "layout": Param(
        LAYOUT_OF_DEPLOYMENT,
        type="string",
        enum=[LAYOUT_OF_DEPLOYMENT, "contract", "gym", "art"],
        values_display={
            LAYOUT_OF_DEPLOYMENT: "the deployment's (REASSEMBLER_LAYOUT, else contract)",
            "contract": "contract: rollouts/, ledger/, tokens/ by ds=",
            "gym": "gym: NeMo Gym's night folder",
            "art": "art: OpenPipe ART's model folder",
        },
        description="Where the inputs sit under the input root (REASSEMBLER_LAYOUT, or the Variable "
        "reassembler_layout): contract = rollouts/ds=<ds>/, ledger/ds=<ds>/, tokens/ds=<ds>/; gym = NeMo Gym's "
        "own night folder (the root holds {ds}): results *.jsonl, token_id_capture/, staged/; art = OpenPipe ART's "
        "model folder (.art/<project>/models/<name>): its train steps recorded on the night. deployment: the "
        "deployment's setting, else contract.",
    ),
    "rollouts": _location_param("rollouts", "the rollout records"),
    "ledger": _location_param("ledger", "the ledger (capture folder)"),
    "tokens": _location_param("tokens", "the token store"),
    "aws_conn_id": Param(
        DEFAULT_CONN_ID,
        type=["null", "string"],
        description="The Airflow Connection (Amazon Web Services) holding the object store's credentials, endpoint "
        "and region; when it is not defined, or empty here, the workers' AWS_* environment.",
    ),
    "input_marker": Param(
        None,
        type=["null", "string"],
        description="A file the capture writes into the night's rollouts folder (rollouts/ds=<ds>/) when the "
        "night is complete (for example _SUCCESS); empty: the input locations suffice.",
    ),
    "report_by": Param(
        None,
        type=["null", "string"],
        description="Rollout metadata keys to break the mask rate down by, comma-separated. "
        "Empty: the keys present on most rollouts.",
    ),
}


@dag(
    dag_id=DAG_ID,
    description="One night of LLM-agent token capture -> verified training rows, an audit table and a "
    "capture-quality report",
    schedule="0 2 * * *",
    start_date=datetime(2026, 11, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=4,  # the warehouse pool, not this, serialises the writers
    render_template_as_native_obj=True,
    default_args={"retries": int(os.environ.get("REASSEMBLER_TASK_RETRIES", "1")), "retry_delay": timedelta(minutes=5)},
    tags=["capture", "training-data"],
    params=PARAMS,
    doc_md=__doc__,
)
def capture_rows_nightly():
    @task(multiple_outputs=True)
    def check_input(params=None, logical_date=None, dag_run=None) -> dict:
        """Resolve the night and the input and output roots; an impossible night, or a
        triggered run's conf naming a key the DAG has no param for, fails at once (no retry)."""
        from airflow.sdk.exceptions import AirflowFailException

        from reassembler.errors import InputError

        unknown = unknown_conf(getattr(dag_run, "conf", None))
        if unknown:
            raise AirflowFailException(unknown)
        print(f"object storage credentials: {use_connection(params)}")
        ds = params.get("ds")
        if not ds and DEFAULT_DS and dag_run is not None and dag_run.run_type == "manual":
            ds = DEFAULT_DS  # a demo deployment: the night `make run` writes
        if not ds:
            anchor = logical_date or dag_run.run_after
            ds = (anchor - timedelta(days=1)).date().isoformat()
        try:
            ds = parse_ds(ds)
        except InputError as e:
            raise AirflowFailException(str(e)) from None
        from reassembler.formats.locations import KINDS, Inputs, confine, templates

        output_dir = _setting("output", DEFAULT_OUTPUT)
        try:
            inputs = Inputs(
                _setting("input", DEFAULT_INPUT),
                (params.get("layout") if params.get("layout") != LAYOUT_OF_DEPLOYMENT else None)
                or _setting("layout", os.environ.get("REASSEMBLER_LAYOUT"))
                or "contract",
                templates(params.get("rollouts") or _setting("rollouts", os.environ.get("REASSEMBLER_ROLLOUTS"))),
                *(
                    params.get(kind) or _setting(kind, os.environ.get(f"REASSEMBLER_{kind.upper()}"))
                    for kind in KINDS[1:]
                ),
            )
            where = inputs.wheres(ds)
            # locations chosen in the trigger form are confined to the deployment's input roots:
            # whoever may trigger the DAG must not make a worker read any file it can
            chosen, roots = _chosen(params, inputs)
            if chosen:
                confine(inputs, ds, chosen, roots)
            marker = params.get("input_marker")
            if marker and ("/" in marker or marker in (".", "..")):
                raise InputError(f"input_marker {marker!r}: a file name in the night's rollouts folder, not a path")
        except InputError as e:
            raise AirflowFailException(str(e)) from None
        print(f"night ds={ds}: output {output_dir}; input " + ", ".join(f"{k} {v}" for k, v in where.items()))
        return {"ds": ds, "input_dir": inputs.text(), "output_dir": output_dir}

    @task.sensor(poke_interval=POKE_SECONDS, timeout=timedelta(days=7).total_seconds(), mode="reschedule")
    def wait_for_input(input_dir: str, night_ds: str, params=None, dag_run=None) -> PokeReturnValue:
        """Wait for the night's input partitions (and the completion marker, if configured)."""
        from airflow.sdk.exceptions import AirflowFailException

        from reassembler import storage
        from reassembler.errors import InputError
        from reassembler.formats.night import find_night, still_written

        use_connection(params)
        try:
            night = find_night(input_dir, night_ds)
            marker = params.get("input_marker")
            where = night.path("rollouts", marker or "")
            missing = still_written(night, SETTLE_SECONDS)  # NeMo Gym's layout: its results file comes last
            if marker and not storage.exists(where):
                missing = f"{where}: completion marker is missing"
        except InputError as e:
            night, missing = None, str(e)
        if missing is None:
            print(
                f"ds={night_ds}: {len(night.rollouts)} rollout files, {len(night.ledger)} ledger files, "
                f"{len(night.tokens)} token files, {len(night.captures)} NeMo Gym local-mode capture files"
            )
            return PokeReturnValue(is_done=True)
        started = dag_run.start_date or datetime.now(UTC)
        waited = (datetime.now(UTC) - started).total_seconds() / 3600
        if waited >= float(params["input_wait_hours"]):
            raise AirflowFailException(
                f"input of ds={night_ds} did not arrive within {params['input_wait_hours']} hours: {missing}"
            )
        print(f"waiting for the input of ds={night_ds} ({waited:.1f} h so far): {missing}")
        return PokeReturnValue(is_done=False)

    @task
    def plan_load(input_dir: str, output_dir: str, night_ds: str, params=None, run_id=None) -> list[int]:
        """Cut the night's input into load parts, written into the run's folder. Returns the
        part numbers, which load_part is mapped over."""
        from reassembler.formats.locations import Inputs
        from reassembler.formats.night import check_output_apart, confine_files, find_night
        from reassembler.load.parts import plan_parts, write_plan
        from reassembler.publish.protocol import staging_dir

        settings = task_settings(params, POOL)
        with task_errors():
            night = find_night(input_dir, night_ds)
            chosen, roots = _chosen(params, Inputs.of(input_dir))
            if chosen:  # every file in a location the trigger form chose, links followed (check_input: its folder)
                confine_files(night, chosen, roots)
            # this worker's spill folder; the warehouse where this worker knows it (an S3 output's
            # is the warehouse worker's own setting: load_ledger checks it there)
            check_output_apart(night, output_dir, temp_directory=settings.duckdb.temp_directory)
            plan = plan_parts(night, settings.load_parts, settings.buckets, settings.merge_buckets is not None)
            write_plan(staging_dir(output_dir, night_ds, run_id), plan)
        print(
            f"ds={night_ds}: {plan.input_bytes:,} bytes of input in {len(plan.parts)} load parts, "
            f"merged in {plan.buckets} buckets"
        )
        return list(range(len(plan.parts)))

    @task(map_index_template="{{ part_label }}")
    def load_part(output_dir: str, night_ds: str, part: int, params=None, run_id=None) -> dict:
        """Parse and check one load part into Parquet in the run's folder (no warehouse)."""
        from airflow.sdk import get_current_context

        from reassembler.load.part_load import load_part as parse_part
        from reassembler.load.parts import read_plan
        from reassembler.memory import step_memory
        from reassembler.publish.protocol import staging_dir

        get_current_context()["part_label"] = f"part {part}"  # the map index the UI shows
        settings = task_settings(params, POOL)
        staging = staging_dir(output_dir, night_ds, run_id)
        with task_errors(), step_memory():
            marker = parse_part(read_plan(staging), part, staging, settings)
        print(f"load part {part}: {marker['rollout_lines']} rollout lines, {marker['ledger_lines']} ledger lines")
        return {k: marker[k] for k in ("part", "rollout_lines", "ledger_lines")}

    @task
    def merge_rollouts(output_dir: str, night_ds: str, parts: list, params=None, run_id=None) -> list[int]:
        """The merge's global step (no warehouse): repeated ids and Episodes, captures,
        numbering, slots and shard ranges, over the parts' rollout rows only. Returns the
        bucket numbers, which merge_keys and merge_bucket are mapped over."""
        from reassembler.load.parts import read_plan
        from reassembler.memory import step_memory
        from reassembler.merge.rollouts import merge_rollouts as run
        from reassembler.publish.protocol import path_safe, staging_dir

        settings = task_settings(params, POOL)
        staging = staging_dir(output_dir, night_ds, run_id)
        with task_errors(), step_memory():
            plan = read_plan(staging)
            marker = run(plan, staging, (output_dir, path_safe(run_id)), settings)
        print(f"merge: {marker['rollouts_loaded']} rollouts of {marker['rollout_lines']} lines, {plan.buckets} buckets")
        return list(range(plan.buckets))

    @task(map_index_template="{{ bucket_label }}")
    def merge_keys(output_dir: str, night_ds: str, bucket: int, params=None, run_id=None) -> dict:
        """One bucket of staging keys (no warehouse): token rows found by their ledger lines."""
        from reassembler.merge.keys import merge_keys as run

        marker = _merge_step(run, f"keys {bucket}", output_dir, night_ds, bucket, params, run_id)
        print(f"key bucket {bucket}: {marker['token_rows']} token rows")
        return {"bucket": bucket, "token_rows": marker["token_rows"]}

    @task(map_index_template="{{ bucket_label }}")
    def merge_bucket(output_dir: str, night_ds: str, keyed: list, bucket: int, params=None, run_id=None) -> dict:
        """One bucket of rollouts (no warehouse): its per-call tables beside the warehouse,
        its shard plan pieces."""
        from reassembler.merge.bucket import merge_bucket as run

        marker = _merge_step(run, f"bucket {bucket}", output_dir, night_ds, bucket, params, run_id)
        print(f"merge bucket {bucket}: {marker['ledger_lines']} ledger lines, rows {marker['rows']}")
        return {"bucket": bucket, "ledger_lines": marker["ledger_lines"]}

    @task(**WRITER)
    def load_ledger(output_dir: str, night_ds: str, buckets: list, params=None, run_id=None) -> list[int]:
        """Commit the merged night into the warehouse; write each shard's rollouts. Returns
        the shard numbers, which the reassemble task is mapped over."""
        from reassembler.build import load_step
        from reassembler.formats.night import check_output_apart
        from reassembler.merge.night_load import PartsLoaded
        from reassembler.publish.protocol import staging_dir
        from reassembler.warehouse import Warehouse

        settings = task_settings(params, POOL)
        with task_errors():
            load = PartsLoaded(staging_dir(output_dir, night_ds, run_id), settings)
            warehouse = Warehouse(output_dir, settings.duckdb)
            check_output_apart(load.night, output_dir, warehouse=warehouse.path)  # the file on this worker
            summary = load_step(load, warehouse, run_id, lock_wait=settings.duckdb.lock_wait_seconds)
        print(f"loaded ds={night_ds} from {len(buckets)} merge buckets:\n  " + "\n  ".join(summary.lines()))
        return list(range(settings.shards))

    @task(**READER)
    def audit_checks(output_dir: str, night_ds: str, shard_results: list, params=None, run_id=None) -> dict:
        """Check the staged night in SQL before anything is published."""
        from dataclasses import asdict

        from reassembler.publish.protocol import staging_dir, verify_staged
        from reassembler.warehouse import Warehouse

        settings = task_settings(params, POOL)
        with task_errors(), Warehouse(output_dir, settings.duckdb).reading() as con:
            numbers = verify_staged(
                con,
                staging_dir(output_dir, night_ds, run_id),
                night_ds,
                settings.max_mask_rate,
                run_id,
                settings.allow_empty,
            )
        shard_rows = sum(shard_results[i]["rows"] for i in range(len(shard_results)))
        if shard_rows != numbers.n_rows:
            raise RuntimeError(f"shards reported {shard_rows} rows, staged files hold {numbers.n_rows}")
        print(
            f"audit checks passed for ds={night_ds}: {numbers.audit_rows} rollouts, {numbers.ok_rollouts} ok, "
            f"{numbers.masked} masked ({numbers.mask_rate:.1%}), {numbers.n_rows} rows"
        )
        return {**asdict(numbers), "shards": len(shard_results)}

    @task(outlets=[ROWS_ASSET], **WRITER)
    def publish(
        input_dir: str,
        output_dir: str,
        night_ds: str,
        numbers: dict,
        params=None,
        run_id=None,
        outlet_events=None,
        dag_run=None,
    ) -> dict:
        """Commit the night with its manifest and bring the partitions to it; emit the rows asset event. Returns
        the published numbers (the report task waits for them). The run's build seconds (recorded with it) are
        those since the DAG run started: the wait for input, the load, the shards, this commit."""
        from reassembler.build import publish_step
        from reassembler.warehouse import Warehouse

        settings = task_settings(params, POOL)
        started = getattr(dag_run, "start_date", None)
        seconds = (datetime.now(UTC) - started).total_seconds() if started else None
        with task_errors():
            warehouse = Warehouse(output_dir, settings.duckdb)
            n = publish_step(
                warehouse,
                night_ds,
                run_id,
                input_dir,
                settings,
                seconds,
                lock_wait=settings.duckdb.lock_wait_seconds,
            )
        print(
            f"published ds={night_ds}: {n.n_rows} rows, {n.ok_rollouts} ok, {n.masked} masked; "
            f"rows in {output_dir}/rows/ds={night_ds}/"
        )
        published = {
            "ds": night_ds,
            "partition": f"{output_dir}/rows/ds={night_ds}",
            "manifest": f"{output_dir}/_published/ds={night_ds}.json",
            "rows": n.n_rows,
            "rollouts": n.audit_rows,
            "ok": n.ok_rollouts,
            "masked": n.masked,
            "mask_rate": round(n.mask_rate, 6),
            "mask_reasons": n.reasons,
            "run_id": run_id,
        }
        event = outlet_events[ROWS_ASSET]
        event.extra = published
        if hasattr(event, "add_partitions"):  # Airflow 3.3: the night is the event's partition key
            event.add_partitions(night_ds)  # (3.2 has no partitioned assets: the night is extra["ds"] alone)
        return published

    @task(**READER)
    def quality_report(output_dir: str, night_ds: str, published: dict, params=None) -> str:
        """Write the night's capture-quality report and the index page (no token reads)."""
        from reassembler.build import report_step
        from reassembler.warehouse import Warehouse

        settings = task_settings(params, POOL)
        with task_errors():
            page = report_step(
                Warehouse(output_dir, settings.duckdb), night_ds, int(params["report_nights"]), _by(params)
            )
        print(f"capture-quality report of ds={night_ds}: {page}")
        return str(page)

    @task(**WRITER)
    def quality_gate(output_dir: str, night_ds: str, report: str, params=None, run_id=None) -> dict:
        """Fail (no retry) listing every breached threshold; the rows stay published. Returns
        (XCom) what `reassembler gate --json` prints, for a monitoring system."""
        from airflow.sdk.exceptions import AirflowFailException

        from reassembler.audit.quality import breaches_of, check_lines, gate_document
        from reassembler.build import gate_step
        from reassembler.warehouse import Warehouse

        settings = task_settings(params, POOL)
        thresholds = thresholds_from_params(params)
        with task_errors():
            checks = gate_step(
                Warehouse(output_dir, settings.duckdb),
                night_ds,
                run_id,
                thresholds,
                int(params["report_nights"]),
                _by(params),
            )
        print("\n".join(check_lines(checks)))
        document = gate_document(night_ds, checks, thresholds)
        print("gate json: " + json.dumps(document, sort_keys=True))
        breaches = breaches_of(checks)
        if breaches:
            raise AirflowFailException(
                f"capture quality of ds={night_ds} breached {len(breaches)} threshold(s): "
                + "; ".join(b["message"] for b in breaches)
                + f" (report: {report})"
            )
        print(f"quality gate passed for ds={night_ds}")
        return document

    night = check_input()
    ready = wait_for_input(night["input_dir"], night["ds"])
    cut = plan_load(night["input_dir"], night["output_dir"], night["ds"])
    ready >> cut
    parts = load_part.partial(output_dir=night["output_dir"], night_ds=night["ds"]).expand(part=cut)
    numbers = merge_rollouts(night["output_dir"], night["ds"], parts)
    keyed = merge_keys.partial(output_dir=night["output_dir"], night_ds=night["ds"]).expand(bucket=numbers)
    buckets = merge_bucket.partial(output_dir=night["output_dir"], night_ds=night["ds"], keyed=keyed).expand(
        bucket=numbers
    )
    loaded = load_ledger(night["output_dir"], night["ds"], buckets)
    shards = ReassembleOperator.partial(
        task_id="reassemble",
        output_dir=night["output_dir"],
        ds=night["ds"],
        run_id="{{ run_id }}",
        settings="{{ params }}",
        map_index_template="shard {{ task.shard }}: {{ task.group_range }}",
    ).expand(shard=loaded)  # no pool, any queue: a shard reads the output store only
    numbers = audit_checks(night["output_dir"], night["ds"], shards.output)
    published = publish(night["input_dir"], night["output_dir"], night["ds"], numbers)
    report = quality_report(night["output_dir"], night["ds"], published)
    quality_gate(night["output_dir"], night["ds"], report)


def _merge_step(run, label: str, output_dir: str, night_ds: str, bucket: int, params, run_id) -> dict:
    """Run one bucket step of the merge (keys or rollouts) in a mapped task; returns its marker."""
    from airflow.sdk import get_current_context

    from reassembler.load.parts import read_plan
    from reassembler.memory import step_memory
    from reassembler.publish.protocol import path_safe, staging_dir

    get_current_context()["bucket_label"] = label  # the map index the UI shows
    settings = task_settings(params, POOL)
    staging = staging_dir(output_dir, night_ds, run_id)
    with task_errors(), step_memory():
        return run(read_plan(staging), staging, bucket, (output_dir, path_safe(run_id)), settings)


def _chosen(params, inputs) -> tuple[list[str], list[str]]:
    """The input kinds whose location the trigger form chose, and the roots they must stay
    under (REASSEMBLER_ALLOWED_INPUT_ROOTS or the Variable; default: the input root)."""
    chosen = [kind for kind in ("rollouts", "ledger", "tokens") if params.get(kind)]
    roots = _setting("allowed_input_roots", os.environ.get("REASSEMBLER_ALLOWED_INPUT_ROOTS"))
    return chosen, (roots.split(",") if roots else [inputs.input or ""])


def unknown_conf(conf) -> str | None:
    """The one-line failure of a triggered run whose conf holds a key the DAG has no param for
    (`{"shard": 2}`: Airflow would run the defaults), with the nearest param; None when all
    are known."""
    from difflib import get_close_matches

    known = sorted(PARAMS)
    for key in sorted((conf or {}).keys()):
        if key not in known:
            near = get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            return f"conf key {key!r} is no param of {DAG_ID}{hint} (params: {', '.join(known)})"
    return None


def _by(params) -> list[str] | None:
    return [k.strip() for k in params["report_by"].split(",") if k.strip()] if params.get("report_by") else None


capture_rows_nightly = capture_rows_nightly()  # the DAG object, imported by dags/capture_rows_nightly.py
