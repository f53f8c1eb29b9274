"""The fields of the warehouse's rollout and ledger records, defined once.

Everything else takes its columns from here: the tables' DDL (`sql/schema.sql` fills in
`{rollouts_columns}` from ROLLOUT_ROW, sql/night_tables.sql `{ledger_columns}` and
`{items_columns}`), the Arrow schemas the reader inserts with (load/read.py), the JSON
schema the ledger is parsed in columns with (load/ledger_columns.py), the ledger's field
groups (the custody fields a token row repeats, the integers, the digests, the version
defaults: records.py, token_file.py, checks.py), the calls the verification works on
(verify/calls.py's Call), the column lists of the queries that read calls back
(`{call_columns}` in sql/shard_calls.sql and sql/explain_ledger.sql), and the tests'
in-memory tables. A column added here reaches all of them; the migration
that adds it to existing warehouses goes in sql/migrations/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import pyarrow as pa

# Field types by name; their Arrow and SQL types are made when asked for (`arrow_type`), so
# that importing this module loads no pyarrow: the command's rollout children, and the
# command itself before it starts them, import the formats and nothing heavy.
S, I64, I32, F64, ITEMS_TYPE, MODEL_ITEMS_TYPE = "string", "int64", "int32", "float64", "items", "model_items"
_SQL_TYPES = {
    S: "VARCHAR",
    I64: "BIGINT",
    I32: "INTEGER",
    F64: "DOUBLE",
    ITEMS_TYPE: "STRUCT(id VARCHAR, fingerprint VARCHAR)[]",
    MODEL_ITEMS_TYPE: "STRUCT(output_index INTEGER, field BLOB)[]",
}


def arrow_type(name: str) -> pa.DataType:
    import pyarrow as pa

    return {
        S: pa.string(),
        I64: pa.int64(),
        I32: pa.int32(),
        F64: pa.float64(),
        ITEMS_TYPE: pa.list_(pa.struct([("id", pa.string()), ("fingerprint", pa.string())])),
        MODEL_ITEMS_TYPE: pa.list_(pa.struct([("output_index", pa.int32()), ("field", pa.binary())])),
    }[name]


class Field(NamedTuple):
    name: str
    type: str  # one of the names above
    required: bool = False  # NOT NULL
    doc: str = ""
    group: str = ""  # ledger: lineage, int, digest (what a token row repeats), or its role
    default: int | None = None  # a version field a NeMo Gym row may leave out takes this


ROLLOUT = (
    Field("rollout_seq", I64, True, "input order inside the night"),
    Field("rollout_id", S, True),
    Field("group_id", S, True),
    Field("slot", I32, True),
    Field("reward", F64),
    Field("reward_problem", S, doc="why reward is null: invalid_reward detail"),
    Field("failure_reason", S),
    Field("terminal_model_call_id", S),
    Field("terminal_response_id", S, doc="response.id: declares the terminal by response_id"),
    Field("generated_items", ITEMS_TYPE, doc="(id, fingerprint) of the output's generated items"),
    Field("model_items", MODEL_ITEMS_TYPE, doc="NeMo Gym fingerprint input: F bytes of model-authored items"),
    Field("n_output_items", I32),
    Field("metadata", S),
    Field("source_file", S),
    Field("source_line", I64),
    # which capture the load read for the rollout (CONTRACT.md 9), and what it found there
    Field("capture", S, doc="staged | local | rebuilt | verifiers | envelope | none (no capture read)"),
    Field("capture_reason", S, doc="a rollout check of the capture that failed (9.2-9.4, 9.10, 10.4)"),
    Field("capture_detail", S),
    Field("capture_call_id", S),
    Field("n_token_items", I32, doc="rebuilt: the line's token items"),
    Field("trace", S, doc="verifiers, envelope: rows' node or call paths, counts, policy versions (JSON)"),
    # where the rollout came from (CONTRACT.md 5.3): copied onto its rows
    Field("evidence", S, doc="envelope: digest (version 3) | none (version 2); else by capture"),
    Field("env", S, doc="the rollout's environment, where the capture records it"),
    Field("agent", S, doc="the rollout's agent, where the capture records it"),
    Field("temperature", F64, doc="the sampling temperature, where the capture records it"),
)

# A rollout's fields that grow with its calls (one item per generated call, the trace's rows):
# they live in the per-call table rollout_items beside the warehouse (call_tables.py), never
# in its file, and the merge's serial steps never read them (docs/merge.md). The warehouse's
# rollout rows are the others (ROLLOUT_ROW); a load part writes both, its rollout rows with
# the verifiers Episode id (EPISODE) the global step needs.
ITEMS = ("generated_items", "model_items", "trace")
ROLLOUT_ROW = tuple(f for f in ROLLOUT if f.name not in ITEMS)
ROLLOUT_ITEMS = (
    Field("rollout_id", S, True),
    *(f for f in ROLLOUT if f.name in ITEMS),
)
EPISODE = Field("episode", S, doc="verifiers: the Episode id of the line (CONTRACT.md 10.2)")

LEDGER = (
    Field("capture_seq", I64, True, "capture order: files by path, then line", group="source"),
    Field("rollout_id", S, True, group="lineage"),
    Field("model_call_id", S, True, group="lineage"),
    Field("parent_call_id", S, group="lineage"),
    Field("mode", S, group="lineage"),
    Field("prev_len", I64, group="int"),
    Field("delta_len", I64, group="int"),
    Field("cum_len", I64, group="int"),
    Field("weight_version", I64, group="int"),
    Field("schema_version", I64, group="int", default=2),  # NeMo Gym's CallRecord / StagedCallRecord defaults
    Field("digest_version", I64, group="int", default=2),
    Field("extras_digest_version", I64, group="int", default=1),
    Field("digest", S, group="digest"),
    Field("extras_digest", S, group="digest"),
    Field("chain_hash", S, group="digest"),
    Field("cumulative_hash", S, group="digest"),
    Field("staging_key", S, True, group="key"),
    Field("response_id", S, group="evidence"),
    Field("admitted_at", F64, group="source"),
    Field("output_items", ITEMS_TYPE, doc="null when absent", group="evidence"),
    Field("output_fingerprint", S, doc="NeMo Gym's per-call evidence", group="evidence"),
    Field("fingerprint_version", I64, group="evidence"),
    Field("failure_reason", S, group="poison"),
    Field("source_file", S, group="source"),
    Field("source_line", I64, group="source"),
    # NeMo Gym's local mode and rebuilt lines, verifiers' nodes: read into calls by the load, checked there
    Field("capture", S, doc="null: a ledger line; else local, rebuilt, verifiers, envelope", group="capture"),
    Field("entry_fault", S, doc="local: the entry's first failing check (load/local_capture.py)", group="capture"),
    Field("entry_detail", S, group="capture"),
)


def _group(name: str) -> tuple[str, ...]:
    return tuple(f.name for f in LEDGER if f.group == name)


# The custody fields a ledger row shares with its token row (CONTRACT.md 2.2 / 2.3)
LINEAGE_FIELDS = _group("lineage")
LEDGER_INTS = _group("int")
LEDGER_DIGESTS = _group("digest")
SHARED_FIELDS = LINEAGE_FIELDS + LEDGER_INTS + LEDGER_DIGESTS
VERSION_DEFAULTS = {f.name: f.default for f in LEDGER if f.default is not None}

# the ledger fields a Call is built from (verify/calls.py), in the order the queries return them
CALL = tuple(f for f in LEDGER if f.name not in ("admitted_at", "source_file", "source_line"))


def ledger_json() -> pa.Schema:
    """The ledger's fields as a JSON line names them, typed (load/ledger_columns.py parses
    them so); NeMo Gym writes the staged digest as `staging_digest`, read into `digest`."""
    import pyarrow as pa

    return pa.schema(
        [
            (f.name, arrow_type(f.type))
            for f in LEDGER
            if f.group not in ("source", "capture") or f.name == "admitted_at"
        ]
        + [("staging_digest", pa.string())]
    )


def python_type(f: Field) -> type:
    """The Python type of one value of a field, as a record holds it (None when not required)."""
    return {S: str, I64: int, I32: int, F64: float}.get(f.type, list)


def arrow_schema(fields: tuple[Field, ...]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([(f.name, arrow_type(f.type)) for f in fields])


def ddl(fields: tuple[Field, ...]) -> str:
    """The column definitions of a CREATE TABLE (after `ds DATE NOT NULL`)."""
    lines = []
    for k, f in enumerate(fields):
        comma = "," if k < len(fields) - 1 else ""
        line = f"    {f.name:<23}{_SQL_TYPES[f.type]}{' NOT NULL' if f.required else ''}{comma}"
        lines.append(f"{line:<60}-- {f.doc}" if f.doc else line)
    return "\n".join(lines)


def select_list(fields: tuple[Field, ...], alias: str) -> str:
    return ", ".join(f"{alias}.{f.name}" for f in fields)
