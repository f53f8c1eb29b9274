"""DuckDB's JSON reader for NeMo Gym's TokenEntry files (load/entry_reader.py) gives the
line reader's verdict on every file: where DuckDB is lenient (a float, a boolean or a
string where an id belongs, an integer beyond int64, a repeated key, a lone surrogate, a
torn final line, a line over the limit, bytes that are not UTF-8, ...) the file goes back
to the line reader, for that file alone. Each case is one worked-example capture with the
damage written out; both readers must give the same rollout: check, detail, calls, token
rows (ids, mask, log probabilities) and entry walk."""

from __future__ import annotations

import re

import numpy as np
import pytest

from nights import DS, Night, worked_example_local
from reassembler.load import entry_reader
from reassembler.load.entry_reader import EntryReader
from reassembler.load.gym_capture import capture_files
from reassembler.load.local_capture import read_capture, read_captures


@pytest.fixture
def capture(tmp_path):
    """(ledger folder, the rollout's CaptureFiles, its entries file's bytes)."""
    night = Night(tmp_path, DS)
    worked_example_local(night, delta=True)
    folder = night.write() / "ledger" / f"ds={DS}"
    [files] = capture_files(sorted(p.name for p in folder.iterdir()), None).values()
    return str(folder), files, (folder / files.entries).read_bytes()


def _seen(out) -> tuple:
    tokens = [(t.staging_key, t.ids.tolist(), t.mask.tolist(), np.asarray(t.logprobs).tolist()) for t in out.tokens]
    return out.reason, out.detail, out.call_id, out.calls, tokens, out.n_lines, out.walk


def _both(folder, files, data: bytes) -> tuple[bool, tuple, tuple]:
    """(DuckDB read the file itself, the line reader's rollout, the DuckDB reader's)."""
    fetched = {files.entries: data}
    reader = EntryReader()
    try:
        [columns] = reader.read([data])
    finally:
        reader.close()
    line = read_capture(folder, files, fetched)
    duck = read_capture(folder, files, fetched, columns)
    return columns is not None, _seen(line), _seen(duck)


def test_a_sound_file_is_read_by_duckdb_as_the_line_reader_reads_it(capture):
    folder, files, data = capture
    used, line, duck = _both(folder, files, data)
    assert used and line == duck
    assert line[0] is None and len(line[3]) == 5  # the worked example's five calls, unmasked


def _first(data: bytes, old: bytes, new: bytes) -> bytes:
    assert old in data, old
    return data.replace(old, new, 1)


def _in_list(name: bytes, text: bytes):
    """Damage: the first `name` list of the file becomes `text`."""
    return lambda d: re.sub(b'"' + name + rb'":\[[^\]]*\]', b'"' + name + b'":[' + text + b"]", d, count=1)


DAMAGE = {
    # where DuckDB's reader is lenient, or reads what the contract refuses: the line reader judges
    "float id": (_in_list(b"prompt_token_ids", b"101.0,102"), False),
    "fractional id": (_in_list(b"generation_token_ids", b"11.5"), False),
    "exponent id": (_in_list(b"prompt_token_ids", b"1e2"), False),
    "boolean id": (_in_list(b"prompt_token_ids", b"true,102"), False),
    "string id": (_in_list(b"generation_token_ids", b'"11"'), False),
    "null id": (_in_list(b"prompt_token_ids", b"null,102"), False),
    "id beyond int64": (_in_list(b"prompt_token_ids", b"99999999999999999999"), False),
    "leading zero id": (_in_list(b"prompt_token_ids", b"0101"), False),
    "plus sign id": (_in_list(b"prompt_token_ids", b"+101"), False),
    "minus alone": (_in_list(b"prompt_token_ids", b"-"), False),
    "trailing comma": (_in_list(b"prompt_token_ids", b"101,"), False),
    "trailing comma and a blank": (_in_list(b"prompt_token_ids", b"101, "), False),
    "a comma alone": (_in_list(b"generation_token_ids", b" , "), False),
    "empty element": (_in_list(b"prompt_token_ids", b"101,,102"), False),
    "string log probability": (_in_list(b"generation_log_probs", b'"-0.5"'), False),
    "NaN log probability": (_in_list(b"generation_log_probs", b"NaN"), False),
    "infinite log probability": (_in_list(b"generation_log_probs", b"-1e400"), False),
    "log probability .5": (_in_list(b"generation_log_probs", b"-.5"), False),
    "log probability 5.": (_in_list(b"generation_log_probs", b"-5."), False),
    "log probability +e": (_in_list(b"generation_log_probs", b"-1e+"), False),
    "nested list": (_in_list(b"prompt_token_ids", b"[101],102"), False),
    "repeated list key": (
        lambda d: _first(d, b'"prompt_token_ids":', b'"prompt_token_ids":[7],"prompt_token_ids":'),
        False,
    ),
    "escaped key": (lambda d: _first(d, b'"prompt_token_ids"', b'"prompt\\u005ftoken_ids"'), False),
    "lone surrogate": (lambda d: _first(d, b'"model_call_id":"', b'"model_call_id":"\\ud800'), False),
    "not UTF-8": (lambda d: _first(d, b'"model_call_id":"', b'"model_call_id":"\xff'), False),
    "torn final line": (lambda d: d[: d.rstrip(b"\n").rfind(b"[") + 3], False),
    "not JSON in the middle": (lambda d: _first(d, b"\n", b"\n{not json\n"), False),
    "a line that is an array": (lambda d: _first(d, b"\n", b"\n[1,2]\n"), False),
    "list key absent": (lambda d: re.sub(rb'"generation_log_probs":\[[^\]]*\],?', b"", d, count=1), None),
    # what DuckDB reads exactly as the line reader does (a repeated key outside the lists:
    # the rest of the line is orjson's, as in the line reader)
    "repeated other key": (lambda d: _first(d, b'"model_call_id":', b'"model_call_id":"x","model_call_id":'), True),
    "blank lines": (lambda d: d.replace(b"\n", b"\n\n \n"), True),
    "blanks in a list": (_in_list(b"prompt_token_ids", b" 101 , 102\t,103 "), True),
    "negative id": (_in_list(b"prompt_token_ids", b"-101,102"), True),
    "empty lists": (_in_list(b"prompt_token_ids", b""), True),
    "no final newline": (lambda d: d.rstrip(b"\n"), True),
    "exponent log probability": (_in_list(b"generation_log_probs", b"-1.5E-3"), None),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damage_gets_the_line_readers_verdict(capture, case):
    folder, files, data = capture
    damage, duckdb_reads = DAMAGE[case]
    damaged = damage(data)
    assert damaged != data
    used, line, duck = _both(folder, files, damaged)
    assert line == duck
    if duckdb_reads is not None:
        assert used is duckdb_reads


def test_a_line_over_the_limit_goes_to_the_line_reader(capture, monkeypatch):
    folder, files, data = capture
    monkeypatch.setattr(entry_reader, "MAX_OBJECT_BYTES", 64)
    used, line, duck = _both(folder, files, data)
    assert not used and line == duck and line[0] is None


def test_one_bad_file_in_a_batch_leaves_the_others_to_duckdb(capture):
    folder, files, data = capture
    torn = data[: len(data) - 20]
    reader = EntryReader()
    try:
        read = reader.read([data, torn, data])
    finally:
        reader.close()
    assert read[0] is not None and read[1] is None and read[2] is not None
    assert [len(r.lines) for r in (read[0], read[2])] == [data.count(b"\n")] * 2


def test_the_batched_reader_gives_every_capture_as_read_alone(capture, monkeypatch):
    """read_captures batches entries files for DuckDB; each rollout is what read_capture
    gives alone, a damaged file among them included."""
    folder, files, data = capture
    from pathlib import Path

    names = []
    for k, content in enumerate((data, data[:-20], data.replace(b"101", b"101.0", 1), data)):
        name = f"copy{k}"
        for rel in (files.entries, files.state, files.intents):
            if rel is not None:
                target = Path(folder) / rel.replace(files.key, name, 1)
                own = content.replace(f'"rollout_id":"{files.key}"'.encode(), f'"rollout_id":"{name}"'.encode())
                target.write_bytes(own if rel == files.entries else (Path(folder) / rel).read_bytes())
        names.append(name)
    every = capture_files(sorted(p.name for p in Path(folder).iterdir()), None)
    captures = [every[n] for n in names]
    monkeypatch.setattr("reassembler.load.local_capture.BATCH_BYTES", 2 * len(data))
    queried, real = [], EntryReader._query
    monkeypatch.setattr(EntryReader, "_query", lambda self, batch: queried.append(len(batch)) or real(self, batch))
    batched = [_seen(out) for out in read_captures(folder, captures)]
    alone = [_seen(read_capture(folder, c)) for c in captures]  # the line reader
    assert batched == alone
    assert max(queried) >= 2  # DuckDB read several files a query
    reasons = [(b[0] and b[0].value, b[1]) for b in batched]
    assert reasons == [
        (None, None),
        ("capture_incomplete", "torn_final_line"),
        ("invalid_record", "line 1: prompt_token_ids is not a list of integers"),
        (None, None),
    ]
