"""A token row group too large to decode at once is read in pieces of rows
(formats/token_pieces.py): pyarrow's default row group (up to a million rows) builds like
the same night in small row groups, locally and on S3; pieces follow the rows' token counts
whether or not delta_len tells them; a row alone past the bound is read up to twice it; the
pages are checked in windows; and the job's own derived token file is cut by tokens."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from reassembler.build import build_night
from reassembler.errors import InputError
from reassembler.formats import parquet_pages, token_pieces
from reassembler.formats.fields import LEDGER_DIGESTS, LEDGER_INTS, LINEAGE_FIELDS
from reassembler.formats.token_file import TokenFile
from reassembler.load.derived_tokens import GROUP_TOKENS, ROW_GROUP_ROWS, row_groups
from reassembler.producer.synth import SynthConfig, synth_night
from reassembler.settings import Settings

DS = "2026-11-28"
SMALL = 64 << 10  # a bound the synthetic night's row groups pass many times over


def _token_file(
    path: Path,
    lengths: list[int],
    delta_len: list[int | None] | None = None,
    logprobs="generation_logprobs_delta",
    **write,
) -> pa.Table:
    """A token file of one row group: row k holds `lengths[k]` tokens, ids k*1000 + 0, 1, ...,
    mask 1 where the id is odd, log probabilities -id/1e6."""
    ids = [[k * 1000 + i for i in range(n)] for k, n in enumerate(lengths)]
    n = len(lengths)
    other = {name: pa.nulls(n, pa.string()) for name in LINEAGE_FIELDS + LEDGER_DIGESTS}
    other.update({name: pa.array(np.zeros(n, np.int64)) for name in LEDGER_INTS})
    table = pa.table(
        {
            **other,
            "staging_key": [f"r/c{k}" for k in range(n)],
            "rollout_id": ["r"] * n,
            "model_call_id": [f"c{k}" for k in range(n)],
            "delta_len": pa.array(lengths if delta_len is None else delta_len, pa.int64()),
            "token_ids_delta": pa.array(ids, pa.list_(pa.int64())),
            "token_mask_delta": pa.array([[float(i % 2) for i in row] for row in ids], pa.list_(pa.float32())),
            logprobs: pa.array([[-i / 1e6 for i in row] for row in ids], pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, path, **write)
    return table


def _read_all(file: TokenFile) -> list[list[int]]:
    return [ids for piece in range(len(file.pieces)) for ids in file.read(piece).column("ids").to_pylist()]


@pytest.mark.parametrize("logprobs", ["generation_logprobs_delta", "generation_log_probs_delta"])
def test_a_row_group_past_the_bound_is_read_in_pieces_of_whole_rows(tmp_path, logprobs):
    """40 rows of 0..390 tokens in one row group, 16 bytes a token decoded: with a 16 KiB
    bound, pieces of consecutive rows at most 8 KiB each (by delta_len), covering every row
    once in order; reading them gives the file's rows exactly."""
    lengths = [10 * k for k in range(40)]
    table = _token_file(tmp_path / "t.parquet", lengths, logprobs=logprobs)  # the contract's name, or Gym's
    file = TokenFile(str(tmp_path / "t.parquet"), 16 << 10)
    assert len(file.pieces) > 5 and all(p.group == 0 and p.why is None for p in file.pieces)
    assert [p.first for p in file.pieces] == list(np.cumsum([0] + [p.rows for p in file.pieces[:-1]]))
    assert sum(p.rows for p in file.pieces) == 40 and file.starts[-1] == 40
    assert all(p.size <= 8 << 10 for p in file.pieces if p.rows > 1)
    # what a piece takes counts each token's id, mask and log probability (16 bytes), whichever name
    assert all(p.size >= 16 * sum(lengths[p.first : p.first + p.rows]) for p in file.pieces)
    assert _read_all(file) == table.column("token_ids_delta").to_pylist()
    piece = file.read(3)
    assert piece.column("mask").to_pylist()[0] == [
        float(i % 2) for i in table.column("token_ids_delta")[file.pieces[3].first].as_py()
    ]


def test_pieces_read_out_of_order_start_the_row_group_over_and_read_the_same(tmp_path):
    lengths = [30] * 200
    table = _token_file(tmp_path / "t.parquet", lengths)
    file = TokenFile(str(tmp_path / "t.parquet"), 16 << 10)
    n = len(file.pieces)
    assert n > 4
    order = [n - 1, 0, 2, 1, n - 2]
    for k in order:
        p = file.pieces[k]
        got = file.read(k).column("ids").to_pylist()
        assert got == table.column("token_ids_delta").to_pylist()[p.first : p.first + p.rows]


def test_a_cursor_asked_for_rows_before_where_it_stands_starts_the_row_group_over(tmp_path):
    lengths = [7] * 50
    table = _token_file(tmp_path / "t.parquet", lengths)
    path = str(tmp_path / "t.parquet")
    cursor = token_pieces.Cursor(path, pq.read_metadata(path), 0, ["token_ids_delta"], None, 4, 16 << 10)
    ids = table.column("token_ids_delta").to_pylist()
    assert cursor.read(20, 5).column("token_ids_delta").to_pylist() == ids[20:25]
    assert cursor.read(3, 6).column("token_ids_delta").to_pylist() == ids[3:9]
    assert cursor.read(9, 1).column("token_ids_delta").to_pylist() == ids[9:10]


@pytest.mark.parametrize("delta_len", ["null", "lying"])
def test_without_a_delta_len_that_counts_the_lists_the_pieces_follow_the_lists_themselves(tmp_path, delta_len):
    """delta_len all null (as the job's own derived tokens), or adding up wrong: the rows'
    token counts come from their mask lists, decoded first; a row of 1,500 tokens among rows
    of 5 is a piece of its own either way."""
    lengths = [5] * 30 + [1_500] + [5] * 30 + [400] + [5] * 30
    declared = [None] * 92 if delta_len == "null" else [1] * 92
    table = _token_file(tmp_path / "t.parquet", lengths, declared)
    file = TokenFile(str(tmp_path / "t.parquet"), 16 << 10)
    [alone] = [p for p in file.pieces if p.first == 30]
    assert alone.rows == 1 and alone.size >= 1_500 * 16 and alone.why is None
    # a row past a quarter of the bound (400 tokens, 6.4 KB) is alone too: a piece of several
    # rows never passes half the bound
    assert [p.rows for p in file.pieces if p.first == 61] == [1]
    assert all(p.size <= 8 << 10 for p in file.pieces if p.rows > 1)
    assert _read_all(file) == table.column("token_ids_delta").to_pylist()


def test_a_row_alone_is_read_up_to_twice_the_bound_and_refused_past_it(tmp_path):
    """With a 16 KiB bound: a row of 1,500 tokens (24 KB) is read alone; a row of 3,000 (48
    KB, past 32 KiB) is refused, saying which row, and the rows beside it still read."""
    lengths = [5] * 10 + [1_500] + [5] * 10 + [3_000] + [5] * 10
    table = _token_file(tmp_path / "t.parquet", lengths)
    file = TokenFile(str(tmp_path / "t.parquet"), 16 << 10)
    refused = [p for p in file.pieces if p.why is not None]
    assert [(p.first, p.rows) for p in refused] == [(21, 1)]
    assert (
        refused[0].why.startswith("row 21 of row group 0 decodes to 48,")
        and "over the 32,768 a row may take" in refused[0].why
    )
    rows = table.column("token_ids_delta").to_pylist()
    for k, p in enumerate(file.pieces):
        if p.why is None:
            assert file.read(k).column("ids").to_pylist() == rows[p.first : p.first + p.rows]
        else:
            with pytest.raises(InputError, match="row 21 of row group 0"):
                file.read(k)


@pytest.mark.parametrize("window", [64, 300, 4096, 1 << 20])
def test_the_pages_checked_in_windows_declare_what_the_whole_chunk_declares(tmp_path, window):
    path = tmp_path / "t.parquet"
    _token_file(path, [37] * 120, data_page_size=512, compression="zstd")
    metadata = pq.read_metadata(path)
    data = path.read_bytes()
    for chunk in parquet_pages.chunks(metadata, 0, ["token_ids_delta", "staging_key", "delta_len"]):
        whole = parquet_pages.pages(data[chunk.start : chunk.start + chunk.length])
        read_at = lambda offset, n: data[offset : offset + n]  # noqa: E731
        assert parquet_pages.pages_in_windows(chunk, read_at, window) == whole
        assert whole.values == chunk.values


def test_a_chunk_whose_pages_hold_more_than_its_footer_is_refused_before_a_piece_is_decoded(tmp_path):
    """The token lists' footer understates their 4,000 values as 3,000: delta_len no longer
    counts them, so the lists are to be decoded to cut the row group, and their pages,
    checked first, refuse it: one line naming the file, the row group and the column."""
    from test_hostile_input import understate

    path = tmp_path / "t.parquet"
    _token_file(path, [40] * 100, compression="zstd")
    understate(str(path), 0, 3_000)
    with pytest.raises(InputError) as e:
        TokenFile(str(path), 16 << 10)
    assert str(e.value) == (
        f"{path}: row group 0: column token_mask_delta.list.element: its pages hold 4,000 values, its footer "
        "declares 3,000; not read (a damaged or crafted token file)"
    )


def test_the_derived_token_file_cuts_row_groups_by_rows_and_by_tokens():
    small = row_groups(np.full(600, 5))
    assert small == [0, ROW_GROUP_ROWS, 2 * ROW_GROUP_ROWS, 600]
    big = GROUP_TOKENS + 1
    assert row_groups(np.array([5, big, 5, 5])) == [0, 1, 2, 4]
    half = GROUP_TOKENS // 2
    cuts = row_groups(np.array([half, half, half, half, 3]))
    assert cuts[0] == 0 and cuts[-1] == 5 and len(cuts) >= 3  # at most ~2x GROUP_TOKENS a group
    assert row_groups(np.zeros(0, np.int64)) == [0]


def _one_row_group(root: Path) -> list[Path]:
    """Rewrite every token file under `root` with pyarrow's defaults: one row group each."""
    files = sorted(root.rglob("tokens/**/*.parquet"))
    for path in files:
        pq.write_table(pq.read_table(path), path)
    return files


def _same(a: Path, b: Path) -> None:
    for kind in ("rows", "audit"):
        x, y = (pq.read_table(p / kind / f"ds={DS}") for p in (a, b))
        drop = [c for c in ("run_id",) if c in x.column_names]
        assert x.drop_columns(drop).equals(y.drop_columns(drop)), kind


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """A synthetic night of every capture shape (faults injected), built as written; and the
    same night with its token files in pyarrow's default row groups."""
    root = tmp_path_factory.mktemp("pieces")
    synth_night(root / "small", DS, dataclasses.replace(SynthConfig(), rollouts=60, seed=11))
    built = build_night(root / "small", root / "out-small", DS, Settings())
    shutil.copytree(root / "small", root / "one")
    files = _one_row_group(root / "one")
    assert files and all(pq.read_metadata(f).num_row_groups == 1 for f in files)
    return root, built


def test_a_night_in_pyarrows_default_row_groups_builds_like_the_night_in_small_ones(night, monkeypatch):
    """Every token file one row group, each many times the bound: the night builds with the
    same rows and audit, its row groups read in pieces (none refused)."""
    root, small = night
    cursors = []
    real = token_pieces.Cursor.read
    monkeypatch.setattr(token_pieces.Cursor, "read", lambda self, *a: cursors.append(a) or real(self, *a))
    one = build_night(root / "one", root / "out-one", DS, Settings(max_row_group_bytes=SMALL))
    assert len(cursors) > 10
    assert one.numbers.n_rows == small.numbers.n_rows
    _same(root / "out-small", root / "out-one")
    assert "too_big" not in str(pq.read_table(root / "out-one" / "tables" / "rejects.parquet").to_pylist())


def test_on_s3_a_night_in_default_row_groups_builds_like_the_local_one(night, s3, tmp_path):
    root, _ = night
    inp, out = f"s3://{s3.bucket('capture')}/one", f"s3://{s3.bucket('rows')}/one"
    s3.upload(root / "one", inp)
    build_night(inp, out, DS, Settings(max_row_group_bytes=SMALL), warehouse_file=tmp_path / "w.duckdb")
    s3.download(out, tmp_path / "mirror")
    _same(root / "out-small", tmp_path / "mirror")


def test_the_keys_of_rows_too_big_to_decode_are_left_out_and_the_rows_beside_them_kept(tmp_path):
    """key_batches skips exactly the rows read.TokenFiles lists as too big (here row 21 of
    one row group of 32), reading the keys of the rows before and after it."""
    from reassembler.load.token_keys import key_batches

    path = tmp_path / "t.parquet"
    _token_file(path, [5] * 10 + [1_500] + [5] * 10 + [3_000] + [5] * 10)
    batches = list(key_batches([str(path)], {str(path): [(21, 21)]}))
    rows = [r for b in batches for r in b.column("t_row").to_pylist()]
    assert rows == [k for k in range(32) if k != 21]
    calls = [c for b in batches for c in b.column("t_model_call_id").to_pylist()]
    assert calls == [f"c{k}" for k in range(32) if k != 21]


def test_a_string_longer_than_a_quarter_of_the_bound_refuses_the_row_group_before_it_is_decoded(tmp_path):
    """30 rows, one model_call_id of 2 million characters (a gzip bomb, in small): with a 16
    KiB bound, no piece reads it (its page holds more than the 1 MiB a string may take). The
    token file's row group becomes reject rows, the whole of it, saying so; its keys, read on
    their own, stop the night naming the file, the row group and the column."""
    from reassembler.load.token_keys import group_key_batches

    path = tmp_path / "t.parquet"
    table = _token_file(path, [40] * 30)
    calls = table.column("model_call_id").to_pylist()
    calls[5] = "c" * 2_000_000
    table = table.set_column(table.schema.get_field_index("model_call_id"), "model_call_id", pa.array(calls))
    pq.write_table(table, path, compression="gzip")
    file = TokenFile(str(path), 16 << 10)
    [piece] = file.pieces
    assert (piece.first, piece.rows) == (0, 30)
    assert path.stat().st_size < 64 << 10
    assert (
        "column model_call_id holds a page of 2,0" in piece.why and "past the 1,048,576 a string may take" in piece.why
    )
    with pytest.raises(InputError, match=r"row group 0: column model_call_id holds a page of 2,0\d\d,\d{3} bytes"):
        list(group_key_batches(pq.read_metadata(path), str(path), 0, 0, None, 16 << 10))


@pytest.mark.parametrize("parts", [1, 3])
def test_token_rows_too_big_to_read_count_as_read_and_rejected(night, parts):
    """With a 16 KiB bound the night's rows past 32 KiB (2,048 tokens) are reject rows: the
    load's token counts still hold every row of the files, whether one part reads them or
    three parts and a merge."""
    root, _ = night
    files = sorted((root / "small" / "tokens").rglob("*.parquet"))
    decoded = []  # a row's lists decoded (8 bytes an id, 4 a mask value or a log probability), not its delta_len
    for f in files:
        t = pq.read_table(f)
        logprobs = next(c for c in t.column_names if "logprob" in c or "log_prob" in c)
        widths = {"token_ids_delta": 8, "token_mask_delta": 4, logprobs: 4}
        decoded += np.sum([pc.list_value_length(t.column(c)).to_numpy() * w for c, w in widths.items()], 0).tolist()
    decoded = np.array(decoded)  # and its keys, digests and list offsets: some hundred bytes a row
    too_big, maybe = int(np.count_nonzero(decoded > 32768)), int(np.count_nonzero(decoded > 32768 - 1024))
    assert too_big > 0
    built = build_night(
        root / "small", root / f"out-16k-{parts}", DS, Settings(max_row_group_bytes=16 << 10, load_parts=parts)
    )
    tokens = built.load.tokens
    assert tokens.read == len(decoded) and tokens.loaded == tokens.read - tokens.rejected
    rejects = pq.read_table(root / f"out-16k-{parts}" / "tables" / "rejects.parquet").to_pylist()
    assert too_big <= sum("a row may take" in r["error"] for r in rejects if r["source"] == "tokens") <= maybe
