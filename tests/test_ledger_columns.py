"""The ledger read in columns (ledger_columns.py) loads exactly what the per-line path
loads: the same ledger rows, the same reject rows with the same messages, for any mix of
good and odd lines (hypothesis), and it does take the ordinary lines in columns."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import reassembler.load.json_lines as json_lines
import reassembler.load.read as read
from nights import DS, worked_example
from reassembler.formats.night import find_night
from reassembler.merge.run import load_night
from reassembler.settings import Settings
from reassembler.warehouse import connect

ABSENT = object()
HEX = "ab" * 32


def _field(*values):
    return st.sampled_from(values)


GOOD = {
    "rollout_id": "r1",
    "model_call_id": "c2",
    "parent_call_id": "c1",
    "mode": "token_in",
    "digest": HEX,
    "extras_digest": HEX,
    "chain_hash": HEX,
    "cumulative_hash": HEX,
    "prev_len": 5,
    "delta_len": 3,
    "cum_len": 8,
    "weight_version": 1,
    "schema_version": 2,
    "digest_version": 2,
    "extras_digest_version": 1,
    "staging_key": "k1",
    "response_id": "resp",
}
# odd values of the right JSON type, one field at a time: the columns must handle these
ODD = [
    (name, value)
    for name, values in {
        "rollout_id": (ABSENT, None, ""),
        "model_call_id": (ABSENT, None, "", "c1", "c3"),
        "parent_call_id": (ABSENT, None),
        "failure_reason": (None, "boom"),
        "mode": (ABSENT, None, "text"),
        "digest": (ABSENT, None, "xyz"),
        "staging_digest": (None, HEX),
        "extras_digest": (ABSENT, None),
        "chain_hash": (None,),
        "cumulative_hash": (ABSENT,),
        "prev_len": (ABSENT, None, -1, 0),
        "delta_len": (ABSENT, None),
        "cum_len": (ABSENT, None),
        "weight_version": (ABSENT, None, -2),
        "schema_version": (ABSENT, None, 3),
        "digest_version": (ABSENT, None),
        "extras_digest_version": (ABSENT, None),
        "staging_key": (ABSENT, "", None),
        "response_id": (ABSENT, "", None),
        "admitted_at": (1.5, 3, None),
        "output_items": (
            None,
            [],
            [{"id": "i1", "fingerprint": "f1"}, {"fingerprint": "f2"}],
            [{"id": "", "fingerprint": "f"}],
            [{"id": "i", "fingerprint": None}],
            [{"id": "i"}],
            [None],
        ),
        "output_fingerprint": (HEX, None),
        "fingerprint_version": (2, None),
        "extra": ({"x": 1}, {"nested": {"y": "z"}}),
    }.items()
    for value in values
]
# values of another JSON type: the file goes to the per-line path
WRONG_TYPE = [
    ("rollout_id", 5),
    ("model_call_id", 7),
    ("parent_call_id", 3),
    ("failure_reason", 1),
    ("mode", 2),
    ("digest", 1),
    ("chain_hash", 3),
    ("prev_len", 1.0),
    ("prev_len", "3"),
    ("prev_len", True),
    ("prev_len", 2**70),
    ("delta_len", 2.5),
    ("extras_digest_version", 1.0),
    ("schema_version", "2"),
    ("admitted_at", "x"),
    ("admitted_at", True),
    ("output_items", [5]),
    ("output_items", [{"id": 3, "fingerprint": "f"}]),
    ("output_items", "x"),
    ("output_fingerprint", 3),
    ("fingerprint_version", 2.0),
    ("extra", {"x": [1, "a"]}),
]


def _line(changes) -> dict:
    line = dict(GOOD)
    for name, value in changes:
        line[name] = value
    return {k: v for k, v in line.items() if v is not ABSENT}


# a good line with up to three odd fields, now and then one of another type
LINE = st.tuples(
    st.lists(st.sampled_from(ODD), max_size=3),
    st.one_of(st.just([]), st.just([]), st.just([]), st.lists(st.sampled_from(WRONG_TYPE), max_size=1)),
).map(lambda changes: _line(changes[0] + changes[1]))


def _text(line: dict, damage: str) -> str:
    text = json.dumps(line)
    if damage == "duplicate key":
        return '{"mode": "text", ' + text[1:] if len(line) else '{"a": 1, "a": 2}'
    if damage == "nested duplicate":
        return text[:-1] + (", " if line else "") + '"more": {"q": 1, "q": 2}}'
    if damage == "crlf":
        return text + "\r"
    if damage == "not json":
        return text[:-1]
    if damage == "array":
        return "[" + text + "]"
    if damage == "two objects":
        return text + " " + text
    if damage == "escaped key" and line:
        return text.replace('"schema_version"', '"schema\\u005fversion"', 1)
    return text


DAMAGE = _field(*[""] * 30, "duplicate key", "nested duplicate", "crlf", "not json", "array", "two objects")
FILE = st.lists(st.tuples(LINE, DAMAGE), min_size=1, max_size=6).map(
    lambda lines: [_text(line, d) for line, d in lines]
)
NIGHT = st.lists(
    st.tuples(
        _field("a.jsonl", "r9.lineage.jsonl", "sub/b.jsonl", "r1.lineage.jsonl"),
        FILE,
        _field("", "\n", "\n", "\n", "\n", " \n"),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda f: f[0],
)


def _load(root: Path, out: Path, in_columns: bool, monkeypatch) -> tuple[list, list, tuple]:
    monkeypatch.setattr(read, "LEDGER_IN_COLUMNS", in_columns)
    with connect(out) as con:
        summary = load_night(con, find_night(root, DS), Settings(allow_empty=True))
        ledger = con.execute("SELECT * EXCLUDE (ds) FROM ledger ORDER BY capture_seq").fetchall()
        rejects = con.execute("SELECT * EXCLUDE (ds) FROM rejects ORDER BY source, file, line").fetchall()
    return ledger, rejects, (summary.ledger, summary.n_ledger_rows)


def _night(*changes) -> list:
    """One file whose lines are GOOD with each line's changes."""
    return [("a.jsonl", [json.dumps(_line(c)) for c in changes], "\n")]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(NIGHT)
@example(_night([("failure_reason", "boom"), ("response_id", "")], [("failure_reason", "boom"), ("mode", None)]))
@example(_night([("failure_reason", "boom"), ("prev_len", None), ("output_items", [{"id": "i"}])]))
@example(_night([("schema_version", None)], [("digest_version", ABSENT)]))
def test_columns_load_what_the_per_line_path_loads(monkeypatch, files):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "input"
        for kind in ("rollouts", "tokens"):
            (root / kind / f"ds={DS}").mkdir(parents=True)
        (root / "rollouts" / f"ds={DS}" / "r.jsonl").write_text(
            json.dumps({"rollout_id": "r1", "group_id": "g", "slot": 0, "reward": 1.0, "output": []}) + "\n"
        )
        for name, lines, tail in files:
            path = root / "ledger" / f"ds={DS}" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + tail if lines else tail)
        by_lines = _load(root, Path(tmp) / "lines", False, monkeypatch)
        in_columns = _load(root, Path(tmp) / "columns", True, monkeypatch)
    assert in_columns == by_lines


def test_ordinary_lines_are_read_in_columns(tmp_path, night, monkeypatch):
    """The worked example's ledger goes through pyarrow's JSON reader, none of it line by line."""
    worked_example(night, "grp_g0", compaction=True)
    worked_example(night, "grp_g1", compaction=False)
    inp = night.write()
    per_line: list[str] = []
    original = json_lines.one_line
    monkeypatch.setattr(json_lines, "one_line", lambda source, *a: (per_line.append(source), original(source, *a)))
    with connect(tmp_path / "out") as con:
        summary = load_night(con, find_night(inp, DS))
    assert summary.ledger.loaded == summary.n_ledger_rows > 0
    assert per_line == ["rollouts", "rollouts"]  # the two rollout lines only


@pytest.mark.parametrize("damage", ["blank line", "bom", "long line"])
def test_files_the_columns_cannot_take_are_read_line_by_line(tmp_path, night, damage):
    ledger, _ = worked_example(night, "grp_g0", compaction=True)
    inp = night.write()
    files = sorted((inp / "ledger" / f"ds={DS}").rglob("*.jsonl"))
    text = files[0].read_bytes()
    if damage == "blank line":
        text = text.replace(b"\n", b"\n\n", 1)
    elif damage == "bom":
        text = b"\xef\xbb\xbf" + text
    else:
        text = text + b'{"rollout_id": "' + b"x" * 2000 + b'"}\n'
    files[0].write_bytes(text)
    results = []
    for in_columns in (False, True):
        read.LEDGER_IN_COLUMNS = in_columns
        try:
            with connect(tmp_path / f"out{in_columns}") as con:
                load_night(con, find_night(inp, DS), Settings(max_line_bytes=1000))
                results.append(
                    (
                        con.execute("SELECT * EXCLUDE (ds) FROM ledger ORDER BY capture_seq").fetchall(),
                        con.execute("SELECT * EXCLUDE (ds) FROM rejects ORDER BY file, line").fetchall(),
                    )
                )
        finally:
            read.LEDGER_IN_COLUMNS = True
    assert results[0] == results[1] and len(results[0][0]) >= len(ledger) - 1
