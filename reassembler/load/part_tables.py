"""A load part's tables (load/part_load.py): each one Parquet file written as its rows come
(table_file.TableFile: row groups bounded by rows and bytes, whole or absent), the part's
memory a row group per table whatever the size of the part."""

from __future__ import annotations

import pyarrow as pa

from .. import storage
from ..table_file import TableFile, write_table

__all__ = ["PartTables", "TableFile", "write_table"]


class PartTables:
    """The warehouse's four tables of a part (rollouts, ledger, rejects, token_keys) as
    TableFiles in `folder`: a context that closes them whole, or on an error leaves none."""

    def __init__(
        self, folder: str, schemas: dict[str, pa.Schema], keys: dict[str, str] | None = None, buckets: int = 1
    ):
        self.files: dict[str, TableFile] = {}
        try:
            for name, schema in schemas.items():
                key = (keys or {}).get(name)
                self.files[name] = TableFile(storage.join(folder, f"{name}.parquet"), schema, key, buckets)
        except BaseException:
            self.close(ok=False)
            raise

    def __getitem__(self, name: str) -> TableFile:
        return self.files[name]

    def close(self, ok: bool = True) -> None:
        first: BaseException | None = None
        for file in self.files.values():
            try:
                file.close(ok)
            except BaseException as e:  # the others still closed (or removed)
                ok, first = False, first or e
        if first is not None:
            raise first

    def __enter__(self) -> PartTables:
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close(ok=kind is None)
