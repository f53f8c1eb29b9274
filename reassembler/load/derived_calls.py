"""The calls a rollout line carries itself, gathered as columns where the line is parsed.

A NeMo Gym envelope line (CONTRACT.md 11), a Gym-rebuilt line (9.10) and a verifiers trace
(10) hold their calls' tokens. Each call becomes one derived ledger row, every field null
but its lineage (rollout, call id, parent, mode, staging key `<rollout_id>/<call id>`), its
source line and its capture kind, and one token row: the tokens it adds to its chain.

`CallColumns` gathers them a chunk of rollout rows at a time, rows in order and each row's
calls in order, into two Arrow tables (`DerivedChunk`): the ledger rows (capture_seq left
null) and the token rows (load/derived_tokens.py's file columns). It runs where the lines
are parsed: in the rollout parse's child processes when the night has them
(load/rollout_lines.py), so the load's own process takes a chunk's calls as two tables, not
as a dict and three arrays a call. The load then keeps the calls of the rows it keeps
(`DerivedChunk.of`: a row repeated across parse parts, or a line whose rebuilt capture is not
read, keeps none), numbers them in that same order and writes them (load/gym_capture.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the rollout parse's children import this module before numpy and pyarrow
    import numpy as np
    import pyarrow as pa

    from ..formats.gym_rebuilt import RebuiltRow

# the most tokens a derived token row holds: decoded at 16 bytes a token, within what one row
# read alone may take at the default bound (formats/token_pieces.py ROW_ALONE: 128 MiB)
MAX_ROW_TOKENS = 1 << 23
REBUILT = "rebuilt"  # the capture kind of a Gym-rebuilt line
REBUILT_CALL = "gym-rebuilt-item-{}"  # the calls of a rebuilt line, one per token item (never shown)


@dataclass
class TokenRow:
    """One derived call's token row: the tokens it adds, with their mask and log
    probabilities (int64 / float32 / float32): a local-mode entry's, or a call a rollout
    line carries. Its home is here, light to import: the rollout parse's children build them."""

    staging_key: str
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray


class DerivedCall(NamedTuple):
    """One call a rollout line carries: its id, its parent's, its mode and the tokens it adds."""

    call_id: str
    parent: str | None
    mode: str
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray


def rebuilt_calls(built: RebuiltRow) -> Iterator[DerivedCall]:
    """A Gym-rebuilt line's calls: one per token item, each the parent of the next."""
    for k, (ids, mask, logprobs) in enumerate(built.pieces or ()):
        parent = None if k == 0 else REBUILT_CALL.format(k - 1)
        yield DerivedCall(REBUILT_CALL.format(k), parent, "text" if parent is None else "token_in", ids, mask, logprobs)


def without_output() -> dict:
    """The rollout row's fields a capture that carries its own calls leaves empty: no failure
    reason, no terminal call or response, no output items to select by (a verifiers trace, an
    ART trajectory: each trained branch is a row)."""
    return {
        "failure_reason": None,
        "terminal_model_call_id": None,
        "terminal_response_id": None,
        "generated_items": [],
        "model_items": [],
        "n_output_items": 0,
    }


def token_rows(rollout_id: str, calls: Iterable[DerivedCall]) -> dict[str, TokenRow]:
    """The token rows of a rollout's derived calls by staging key (`reassembler explain`)."""
    keyed = ((f"{rollout_id}/{call.call_id}", call) for call in calls)
    return {key: TokenRow(key, call.ids, call.mask, call.logprobs) for key, call in keyed}


@dataclass
class DerivedChunk:
    """A chunk's derived calls: ledger rows (inserter.LEDGER_BATCH, capture_seq null) and
    their token rows (derived_tokens.FILE_SCHEMA), row for row."""

    calls: pa.Table
    tokens: pa.Table

    def of(self, rollout_ids: list[str]) -> DerivedChunk:
        """The calls of these rollouts only, in the same order (a rollout id names one row
        of a chunk: a part's parse keeps the first of a repeated id)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = set(rollout_ids)
        if wanted.issuperset(pc.unique(self.calls.column("rollout_id")).to_pylist()):
            return self
        keep = pc.is_in(self.calls.column("rollout_id"), value_set=pa.array(sorted(wanted), pa.string()))
        return DerivedChunk(self.calls.filter(keep), self.tokens.filter(keep))


class CallColumns:
    """Derived calls gathered row after row; `take` gives them as one DerivedChunk."""

    COLUMNS = ("rollout_id", "model_call_id", "parent_call_id", "mode", "staging_key", "source_file", "source_line")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._columns: dict[str, list] = {k: [] for k in (*self.COLUMNS, "capture")}
        self._tokens: list[TokenRow] = []  # one a call
        self.n_tokens = 0  # token ids held

    def add(self, row: dict, capture: str, calls: Iterable[DerivedCall]) -> None:
        """The calls of rollout row `row`, read from the line under capture kind `capture`."""
        c = self._columns
        rid, source_file, source_line = row["rollout_id"], row.get("source_file"), row.get("source_line")
        for call in calls:
            key = f"{rid}/{call.call_id}"
            c["rollout_id"].append(rid)
            c["model_call_id"].append(call.call_id)
            c["parent_call_id"].append(call.parent)
            c["mode"].append(call.mode)
            c["staging_key"].append(key)
            c["source_file"].append(source_file)
            c["source_line"].append(source_line)
            c["capture"].append(capture)
            self._tokens.append(TokenRow(key, call.ids, call.mask, call.logprobs))
            self.n_tokens += len(call.ids)

    def take(self) -> DerivedChunk | None:
        """The calls gathered since the last take (None when there are none)."""
        if not self._tokens:
            return None
        import pyarrow as pa

        from ..formats.fields import LEDGER, arrow_schema
        from .derived_tokens import token_table

        n, schema = len(self._tokens), arrow_schema(LEDGER)  # inserter.LEDGER_BATCH (its module imports DuckDB)
        given = {name: pa.array(values, schema.field(name).type) for name, values in self._columns.items()}
        calls = pa.table([given.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)
        chunk = DerivedChunk(calls, token_table(self._tokens))
        self._clear()
        return chunk
