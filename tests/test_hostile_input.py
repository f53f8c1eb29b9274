"""Input that once crashed the job: every line the JSON grammar accepts ends as a row, a
reject row or a masked rollout, and nothing but regular files is read. Builds run as the
real command in a process of its own, so a crash of a native parser is a failed test, not a
dead test run."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nights import DS, Night, worked_example
from reassembler.load.json_lines import nesting_depth
from reassembler.producer.capture import token_table
from reassembler.settings import MAX_JSON_DEPTH


def build(inp: Path, out: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "reassembler.cli",
            "build",
            "--input",
            str(inp),
            "--output",
            str(out),
            "--ds",
            DS,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def two_rollouts(root: Path) -> tuple[Night, Path]:
    n = Night(root)
    worked_example(n, "a_g0")
    worked_example(n, "a_g1", compaction=False, reward=0.0)
    return n, n.write()


def partition(inp: Path, kind: str) -> Path:
    return inp / kind / f"ds={DS}"


def audit(out: Path) -> dict[str, dict]:
    return {a["rollout_id"]: a for a in pq.read_table(out / "audit" / f"ds={DS}").to_pylist()}


def rejects(out: Path, source: str) -> list[tuple]:
    """The night's reject rows of one source (a rejected ledger line also leaves its token row
    asked for by no ledger row: a reject of the tokens source)."""
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        return con.execute(
            "SELECT source, file, line, error, rollout_id FROM rejects WHERE source = ? ORDER BY 2, 3", [source]
        ).fetchall()


def built(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, res.stderr


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# ---------------------------------------------------------------- nesting


def test_a_ledger_line_nested_past_the_bound_is_a_reject_row_not_a_crash(tmp_path):
    """pyarrow's JSON reader kills the process (SIGSEGV) on ~50,000 levels; the line never
    reaches it. The rollout whose lineage lost a line is masked; the other one is built."""
    n, inp = two_rollouts(tmp_path / "n")
    ledger = partition(inp, "ledger") / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    assert all(json.loads(line)["rollout_id"] == "a_g0" for line in lines[:5])
    lines[2] = lines[2][:-1] + ', "extra": ' + nested(60_000) + "}"  # a_g0's third call
    # a_g0's rows in NeMo Gym's layout, <rollout_id>.lineage.jsonl, which names the rollout of
    # a line that cannot be read
    (ledger.parent / "a_g0.lineage.jsonl").write_text("\n".join(lines[:5]) + "\n")
    ledger.write_text("\n".join(lines[5:]) + "\n")
    res = build(inp, tmp_path / "out")
    built(res)
    a = audit(tmp_path / "out")
    assert (a["a_g0"]["reason"], a["a_g1"]["status"]) == ("invalid_record", "ok")
    assert a["a_g0"]["detail"].startswith("1 ledger rows rejected; first: a_g0.lineage.jsonl:3: objects and arrays")
    [(source, file, line, error, rollout)] = rejects(tmp_path / "out", "ledger")
    assert (source, file, line, rollout) == ("ledger", "a_g0.lineage.jsonl", 3, "a_g0")
    assert error == f"objects and arrays nested 60001 deep, over the limit of {MAX_JSON_DEPTH}"


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


# strings made of what a depth count can trip over: brackets, quotes, backslashes, escapes
_TRICKY = st.text(alphabet='[]{}"\\\n\u00e9x', max_size=12)
_VALUES = st.recursive(
    st.none() | st.integers() | _TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY, inner, max_size=4),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, pad=st.integers(0, 2 * MAX_JSON_DEPTH), deep=st.integers(0, MAX_JSON_DEPTH + 3))
def test_a_lines_depth_is_its_values_depth_whatever_its_strings_hold(value, pad, deep):
    """Past MAX_JSON_DEPTH opening brackets, nesting_depth is the value's own depth, strings
    (with their brackets, escaped quotes and backslashes) not counted; within it, the
    brackets themselves, which bound the depth."""
    for _ in range(deep):
        value = [value]
    line = {"pad": [[]] * pad, "value": value, "key[{": '"]}\\'}
    for raw in (json.dumps(line).encode(), json.dumps(line, ensure_ascii=False).encode()):
        opening = raw.count(b"{") + raw.count(b"[")
        assert nesting_depth(raw) == (opening if opening <= MAX_JSON_DEPTH else _depth(line))


def test_brackets_inside_strings_do_not_count_and_the_bound_is_exact(tmp_path):
    n, inp = two_rollouts(tmp_path / "n")
    ledger = partition(inp, "ledger") / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    # a string full of brackets (read), a value nested exactly at the bound (read), one past it (rejected)
    lines[0] = lines[0][:-1] + ', "note": "' + "[{" * 5000 + '"}'
    lines[1] = lines[1][:-1] + ', "extra": ' + nested(MAX_JSON_DEPTH - 1) + "}"  # the row itself is one level
    lines[6] = lines[6][:-1] + ', "extra": ' + nested(MAX_JSON_DEPTH) + "}"
    ledger.write_text("\n".join(lines) + "\n")
    res = build(inp, tmp_path / "out")
    built(res)
    [(_, _, line, error, rollout)] = rejects(tmp_path / "out", "ledger")
    assert (line, rollout) == (7, None) and f"nested {MAX_JSON_DEPTH + 1} deep" in error  # a_g1's c2
    a = audit(tmp_path / "out")
    assert (a["a_g0"]["status"], a["a_g1"]["reason"], a["a_g1"]["detail"]) == (
        "ok",
        "unmatched_output",
        "item 2: no call produced it",
    )


def test_a_rollout_line_nested_past_the_bound_is_a_reject_row(tmp_path):
    n, inp = two_rollouts(tmp_path / "n")
    path = partition(inp, "rollouts") / "rollouts.jsonl"
    record = dict(n.rollouts[0], rollout_id="deep_g0", metadata={"x": json.loads(nested(200))})
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    res = build(inp, tmp_path / "out")
    built(res)
    assert "rollouts 3 read = 2 loaded + 1 rejected" in res.stdout
    [(source, _, line, error, _)] = rejects(tmp_path / "out", "rollouts")
    assert (source, line) == ("rollouts", 3) and "nested 202 deep" in error


# ---------------------------------------------------------------- lone surrogates, huge numbers


def _rewrite_rollout(inp: Path, k: int, edit) -> None:
    path = partition(inp, "rollouts") / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    lines[k] = edit(lines[k])
    path.write_text("\n".join(lines) + "\n")


def test_a_lone_surrogate_in_an_id_is_a_reject_row(tmp_path):
    n, inp = two_rollouts(tmp_path / "n")
    _rewrite_rollout(inp, 1, lambda line: line.replace('"rollout_id": "a_g1"', '"rollout_id": "a_g1\\ud800"'))
    res = build(inp, tmp_path / "out")
    built(res)
    [(source, _, line, error, rollout)] = rejects(tmp_path / "out", "rollouts")
    assert (source, line, rollout) == ("rollouts", 2, None)
    assert error.startswith("rollout_id is not valid Unicode")
    assert set(audit(tmp_path / "out")) == {"a_g0"}


def test_a_lone_surrogate_in_a_ledger_id_rejects_the_line_and_masks_its_rollout(tmp_path):
    n, inp = two_rollouts(tmp_path / "n")
    ledger = partition(inp, "ledger") / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    lines[1] = lines[1].replace('"model_call_id": "c2"', '"model_call_id": "c2\\udfff"')
    ledger.write_text("\n".join(lines) + "\n")
    res = build(inp, tmp_path / "out")
    built(res)
    [(source, _, line, error, rollout)] = rejects(tmp_path / "out", "ledger")
    assert (source, line, rollout) == ("ledger", 2, "a_g0") and error.startswith("model_call_id is not valid Unicode")
    assert audit(tmp_path / "out")["a_g0"]["reason"] == "invalid_record"


def test_a_lone_surrogate_in_output_text_matches_no_call(tmp_path):
    """No UTF-8 encodes the item, so no producer can have fingerprinted it: unmatched."""
    n, inp = two_rollouts(tmp_path / "n")
    _rewrite_rollout(inp, 0, lambda line: line.replace('"text": "a2"', '"text": "a2\\ud83d"'))
    built(build(inp, tmp_path / "out"))
    a = audit(tmp_path / "out")["a_g0"]
    # c2 produced items 2-3 (r2, a2): the span from item 2 no longer matches
    assert (a["reason"], a["detail"]) == ("unmatched_output", "item 2: no call produced it")


def test_a_lone_surrogate_in_metadata_is_kept_as_its_escape(tmp_path):
    n, inp = two_rollouts(tmp_path / "n")
    _rewrite_rollout(inp, 0, lambda line: line[:-1] + ', "metadata": {"agent": "x\\ud800y", "\\udc00": 1}}')
    built(build(inp, tmp_path / "out"))
    a = audit(tmp_path / "out")["a_g0"]
    assert a["status"] == "ok"
    assert a["metadata"] == '{"agent": "x\\ud800y", "\\udc00": 1}'  # six characters each, valid UTF-8
    assert json.loads(a["metadata"]) == {"agent": "x\ud800y", "\udc00": 1}


def test_an_integer_reward_beyond_float64_is_invalid_reward(tmp_path):
    n, inp = two_rollouts(tmp_path / "n")
    _rewrite_rollout(inp, 1, lambda line: line.replace('"reward": 0.0', '"reward": ' + "9" * 400))
    built(build(inp, tmp_path / "out"))
    a = audit(tmp_path / "out")["a_g1"]
    assert (a["reason"], a["detail"]) == ("invalid_reward", "reward is an integer of 400 digits, beyond float64")


# ---------------------------------------------------------------- token files


def _token_file(n: Night, inp: Path, table: pa.Table, **write) -> Path:
    path = partition(inp, "tokens") / "tokens.parquet"
    pq.write_table(table, path, **write)
    return path


def test_unsigned_64_bit_values_past_int64_are_judged_not_crashed_on(tmp_path):
    """A uint64 prev_len past int64 can equal no ledger value (field_mismatch); a uint64 token
    id past int64 is outside [0, 2**31) (invalid_token). Every other width is read too."""
    n, inp = two_rollouts(tmp_path / "n")
    table = token_table(n.tokens)
    rows = table.to_pylist()
    big = 2**63 + 5
    prev = [r["prev_len"] for r in rows]
    prev[1] = big  # a_g0's c2
    ids = [r["token_ids_delta"] for r in rows]
    ids[7] = ids[7][:-1] + [2**64 - 1]  # a_g1's c3
    table = table.set_column(
        table.schema.get_field_index("prev_len"), "prev_len", pa.array(prev, pa.uint64())
    ).set_column(
        table.schema.get_field_index("token_ids_delta"), "token_ids_delta", pa.array(ids, pa.list_(pa.uint64()))
    )
    for name, t in (("delta_len", pa.uint16()), ("weight_version", pa.int8()), ("cum_len", pa.uint32())):
        table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(t))
    _token_file(n, inp, table)
    built(build(inp, tmp_path / "out"))
    a = audit(tmp_path / "out")
    assert (a["a_g0"]["reason"], a["a_g0"]["failed_call_id"]) == ("field_mismatch", "c2")
    assert a["a_g0"]["detail"] == f"prev_len: ledger 5 != token row {-(2**63)}"
    assert (a["a_g1"]["reason"], a["a_g1"]["failed_call_id"]) == ("invalid_token", "c3")


def write_bomb(path: str) -> None:
    """Rewrite a token file with its 7th row (a_g1's c2) holding 30 million tokens, in a
    row group of its own, zstd-compressed to a few KB."""
    rows = pq.read_table(path).to_pylist()
    assert (rows[6]["rollout_id"], rows[6]["model_call_id"]) == ("a_g1", "c2")
    good = pq.read_table(path).take([0, 1, 2, 3, 4, 5, 7, 8, 9])
    bomb = dict(
        rows[6],
        token_ids_delta=np.zeros(30_000_000, np.int64),
        token_mask_delta=np.ones(30_000_000, np.float32),
        generation_logprobs_delta=np.zeros(30_000_000, np.float32),
    )
    one = pa.table({name: pa.array([bomb[name]], good.schema.field(name).type) for name in good.schema.names})
    with pq.ParquetWriter(path, good.schema, compression="zstd") as w:
        w.write_table(good)
        w.write_table(one)


def test_a_tiny_token_file_that_decodes_to_a_huge_row_is_not_decoded(tmp_path):
    """A few KB on disk, 30 million tokens decoded: the row group is refused from its
    metadata (its rows become reject rows, its calls missing_tokens) and memory stays
    bounded. The file is written by another process, so that this one (whose size a new
    process starts from) never holds the tokens."""
    n, inp = two_rollouts(tmp_path / "n")
    path = partition(inp, "tokens") / "tokens.parquet"
    script = f"from test_hostile_input import write_bomb; write_bomb({str(path)!r})"
    subprocess.run(
        [sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    )
    assert path.stat().st_size < 64 << 10 and pq.read_metadata(path).row_group(1).column(5).num_values > 0
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    res = build(inp, tmp_path / "out")
    built(res)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib <= max(before, 400 << 10)  # decoding it took ~1.3 GB
    assert "tokens   10 read = 9 loaded + 1 rejected" in res.stdout
    [(source, file, line, error, rollout)] = rejects(tmp_path / "out", "tokens")
    assert (source, file, line, rollout) == ("tokens", "tokens.parquet", 9, "a_g1")
    assert error.startswith("row group 1 (1 rows) decodes to 480,002,058 bytes, over the 67,108,864")
    a = audit(tmp_path / "out")
    assert (a["a_g0"]["status"], a["a_g1"]["reason"], a["a_g1"]["failed_call_id"]) == ("ok", "missing_tokens", "c2")


def varint(v: int) -> bytes:
    """A Thrift compact-protocol i64, as a Parquet footer holds it (zigzag, then 7 bits a byte)."""
    v, out = (v << 1) ^ (v >> 63), b""
    while True:
        out += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
        v >>= 7
        if not v:
            return out


def understate(path: str, group: int, claimed: int) -> None:
    """Rewrite the footer of `path` so that row group `group`'s list columns declare
    `claimed` values where their pages hold what they hold (a damaged or crafted file): each
    of those counts, a Thrift varint in the footer, replaced by one of the same length."""
    data = bytearray(Path(path).read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    footer = bytes(data[-8 - length : -8])
    held = _ids_column(path, group).num_values
    old, new = varint(held), varint(claimed)
    assert len(old) == len(new) and footer.count(old) >= 3
    data[-8 - length : -8] = footer.replace(old, new)
    Path(path).write_bytes(bytes(data))


def _ids_column(path, group: int):
    rg = pq.read_metadata(path).row_group(group)
    return next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema.startswith("token_ids"))


def peak_of(argv: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """Run `argv` under a fresh Python whose only child it is: (its result, its peak RSS in KiB)."""
    probe = (
        "import resource, subprocess, sys, json; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(json.dumps([r.returncode, r.stdout, r.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))"
    )
    out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=300, check=True)
    code, stdout, stderr, peak = json.loads(out.stdout)
    return subprocess.CompletedProcess(argv, code, stdout, stderr), peak


def test_a_footer_that_understates_its_pages_is_refused_before_anything_is_decoded(tmp_path):
    """The 30-million-token row group again, its footer rewritten to declare 1.1 million
    values (17.6 MB decoded: under the bound). The pages say otherwise, and are read before
    anything is decoded: the night stops naming the file, the row group and the column, and
    the build never comes near the 1 GiB decoding it would take."""
    n, inp = two_rollouts(tmp_path / "n")
    path = partition(inp, "tokens") / "tokens.parquet"
    script = f"from test_hostile_input import write_bomb; write_bomb({str(path)!r})"
    subprocess.run(
        [sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    )
    understate(str(path), 1, 1_100_000)
    assert path.stat().st_size < 64 << 10 and _ids_column(path, 1).num_values == 1_100_000
    cli = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(inp), "--output", str(tmp_path / "out")]
    res, peak_kib = peak_of([*cli, "--ds", DS])
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"reassembler: error: {path}: row group 1: column token_ids_delta.list.element: its pages hold "
        "30,000,000 values, its footer declares 1,100,000; not read (a damaged or crafted token file)"
    )
    assert peak_kib < 400 << 10, peak_kib  # decoding it takes ~1.6 GB
    assert not (tmp_path / "out" / "rows").exists()


def test_a_footer_that_renames_its_chunks_hides_nothing(tmp_path):
    """The 30-million-token row group again, its footer naming that row group's three list
    chunks after columns the job never reads (`path_in_schema`; the schema itself unchanged,
    and the reader decodes each chunk as the schema's column at its place). What a row group
    decodes to is counted by the schema's columns, never the chunks' own names: the row
    group is too big, its row a reject row, and memory stays bounded (it decoded 1.85 GB)."""
    n, inp = two_rollouts(tmp_path / "n")
    path = partition(inp, "tokens") / "tokens.parquet"
    _rewritten(path, f"write_bomb({str(path)!r})")
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    footer = bytes(data[start:-8])
    for name in (b"token_ids_delta", b"token_mask_delta", b"generation_logprobs_delta"):
        at = footer.rfind(name)  # row group 1's chunk (the schema's element comes first)
        data[start + at : start + at + len(name)] = name[:-1] + b"X"
    path.write_bytes(bytes(data))
    rg = pq.read_metadata(path).row_group(1)
    assert rg.column(rg.num_columns - 3).path_in_schema == "token_ids_deltX.list.element"
    cli = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(inp), "--output", str(tmp_path / "out")]
    res, peak_kib = peak_of([*cli, "--ds", DS])
    assert res.returncode == 0, res.stderr
    assert peak_kib < 400 << 10, peak_kib
    [(source, file, line, error, rollout)] = rejects(tmp_path / "out", "tokens")
    assert (source, line, rollout) == ("tokens", 9, "a_g1") and "decodes to 480,00" in error


def write_key_bomb(path: str, column: str, compression: str = "gzip") -> None:
    """Rewrite a token file with its 7th row (a_g1's c2) in a row group of its own, its
    `column` a string of 100 million bytes, compressed to a few hundred KB."""
    table = pq.read_table(path)
    good = table.take([0, 1, 2, 3, 4, 5, 7, 8, 9])
    one = table.take([6])
    one = one.set_column(one.schema.get_field_index(column), column, pa.array(["k" * 100_000_000], pa.string()))
    with pq.ParquetWriter(path, good.schema, compression=compression) as w:
        w.write_table(good)
        w.write_table(one)


def write_dictionary_bomb(path: str, column: str, rows: int = 70_000) -> None:
    """Rewrite a token file with a second row group of `rows` rows whose `column` repeats one
    entry of 1 KiB from its dictionary: a few KB on disk, 70 MB once laid out as strings."""
    good = pq.read_table(path)
    arrays = []
    for field in good.schema:
        if field.name == column:
            arrays.append(pa.array(["x" * 1024] * rows, field.type))
        elif pa.types.is_list(field.type):
            arrays.append(pa.array([[]] * rows, field.type))
        elif pa.types.is_string(field.type):
            arrays.append(pa.array(["z"] * rows, field.type))
        else:
            arrays.append(pa.array(np.zeros(rows, np.int64)).cast(field.type))
    with pq.ParquetWriter(path, good.schema, compression="zstd") as w:
        w.write_table(good)
        w.write_table(pa.table(arrays, schema=good.schema))


def _rewritten(path: Path, call: str) -> None:
    """Run `call` (a write_* function above, with its arguments) in another process, so that
    this one (whose size a new process starts from) never holds what it writes."""
    script = f"from test_hostile_input import *; {call}"
    subprocess.run(
        [sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    )


def test_a_key_column_that_inflates_past_the_bound_stops_the_night_before_it_is_decoded(tmp_path):
    """A staging key of 100 MB, gzip-compressed to a few hundred KB (a gzip bomb in a key
    column): the row group's keys are refused from the footer, held to its pages, before any
    byte is inflated; one line names the file and the row group (exit 2), the build never
    comes near the gigabytes it would take, and nothing is published."""
    n, inp = two_rollouts(tmp_path / "n")
    path = partition(inp, "tokens") / "tokens.parquet"
    _rewritten(path, f"write_key_bomb({str(path)!r}, 'staging_key')")
    assert path.stat().st_size < 1 << 20
    cli = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(inp), "--output", str(tmp_path / "out")]
    res, peak_kib = peak_of([*cli, "--ds", DS])
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    keys = "staging_key, rollout_id, model_call_id"
    assert err.startswith(f"reassembler: error: {path}: row group 1: its columns {keys} decode to 100,000,"), err
    assert err.endswith(
        "over the 67,108,864 the job decodes at once; not read (write token files in smaller row groups)"
    )
    assert "\n" not in err and peak_kib < 400 << 10, peak_kib
    assert not (tmp_path / "out" / "rows").exists()


def test_another_string_column_that_inflates_past_the_bound_makes_its_rows_reject_rows(tmp_path):
    """The 100 MB string in parent_call_id instead, which only the shards read: the row group
    is too big to decode (its keys are small), so its row is a reject row that says why and
    its call is missing_tokens; the other rollout trains, and memory stays bounded."""
    n, inp = two_rollouts(tmp_path / "n")
    path = partition(inp, "tokens") / "tokens.parquet"
    _rewritten(path, f"write_key_bomb({str(path)!r}, 'parent_call_id')")
    cli = [sys.executable, "-m", "reassembler.cli", "build", "--input", str(inp), "--output", str(tmp_path / "out")]
    res, peak_kib = peak_of([*cli, "--ds", DS])
    assert res.returncode == 0, res.stderr
    assert peak_kib < 400 << 10, peak_kib
    [(source, file, line, error, rollout)] = rejects(tmp_path / "out", "tokens")
    assert (source, file, line, rollout) == ("tokens", "tokens.parquet", 9, "a_g1")
    assert error.startswith("row group 1 (1 rows) decodes to 100,00") and "over the 67,108,864" in error
    a = audit(tmp_path / "out")
    assert (a["a_g0"]["status"], a["a_g1"]["reason"], a["a_g1"]["failed_call_id"]) == ("ok", "missing_tokens", "c2")


def test_a_dictionary_repeated_past_the_bound_is_measured_before_it_is_laid_out(tmp_path):
    """70,000 rows whose model_call_id repeats one 1 KiB dictionary entry: a few KB on disk
    and in the footer, 70 MB as strings. The keys are read as a dictionary and measured; the
    night stops with one line naming the file, the row group and the column (exit 2)."""
    n, inp = two_rollouts(tmp_path / "n")
    path = partition(inp, "tokens") / "tokens.parquet"
    _rewritten(path, f"write_dictionary_bomb({str(path)!r}, 'model_call_id')")
    assert path.stat().st_size < 1 << 20 and pq.read_metadata(path).row_group(1).num_rows == 70_000
    res = build(inp, tmp_path / "out")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"reassembler: error: {path}: row group 1: column model_call_id's strings decode to more than 67,108,864 "
        "bytes with the rest of the row group (a dictionary of long entries, repeated); not read (a damaged or "
        "crafted token file)"
    )


# ---------------------------------------------------------------- files that are not files


@pytest.mark.parametrize("kind, name", [("rollouts", "more.jsonl"), ("ledger", "x.jsonl"), ("tokens", "t.parquet")])
def test_a_named_pipe_in_a_partition_stops_the_night_naming_it(tmp_path, kind, name):
    n, inp = two_rollouts(tmp_path / "n")
    fifo = partition(inp, kind) / name
    os.mkfifo(fifo)
    res = build(inp, tmp_path / "out", timeout=60)  # a read of it would block forever
    assert res.returncode == 2
    assert res.stderr.strip() == f"reassembler: error: {fifo}: not a regular file (a named pipe); only files are read"


def test_a_socket_in_the_ledger_folder_stops_the_night(tmp_path):
    n, inp = two_rollouts(tmp_path / "n")
    sub = partition(inp, "ledger") / "server-a"
    sub.mkdir()
    short = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path must be short
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(short / "capture.sock"))
        os.rename(short / "capture.sock", sub / "capture.sock")
        res = build(inp, tmp_path / "out")
    assert res.returncode == 2 and "capture.sock: not a regular file (a socket)" in res.stderr


@pytest.mark.parametrize("fan_out", [(), ("--load-parts", "2", "--merge-buckets", "2")], ids=["one", "two"])
def test_a_rollouts_first_rejected_ledger_line_is_the_first_by_file_then_line(tmp_path, fan_out):
    _, inp = two_rollouts(tmp_path / "n")
    folder = partition(inp, "ledger")
    nameless = '{{"rollout_id": "{}", "parent_call_id": null}}'  # no model_call_id: a reject row of its rollout
    (folder / "a.jsonl").write_text(nameless.format("a_g1") + "\n" + nameless.format("a_g0") + "\n")
    (folder / "b.jsonl").write_text(nameless.format("a_g0") + "\n")
    built(build(inp, tmp_path / "out", *fan_out))
    a = audit(tmp_path / "out")
    assert a["a_g0"]["detail"].startswith("2 ledger rows rejected; first: a.jsonl:2: "), a["a_g0"]["detail"]
    assert a["a_g1"]["detail"].startswith("1 ledger rows rejected; first: a.jsonl:1: "), a["a_g1"]["detail"]
