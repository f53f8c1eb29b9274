"""`reassembler report`: capture quality across every night the warehouse holds."""

from __future__ import annotations

from ..publish.protocol import pending
from ..warehouse import connect, sql


def report(output_dir, warehouse=None) -> str:
    with connect(output_dir, read_only=True, database=warehouse) as con:
        nights = con.execute(sql("report_nights")).fetchall()
        columns = [d[0] for d in con.description]
        reasons = con.execute(sql("report_reasons")).fetchall()
        captures = con.execute(sql("report_captures")).fetchall()
        waiting = pending(con, output_dir)
    if not nights:
        return "no published night in this warehouse"
    widths = [max(len(str(c)), *(len(str(row[i])) for row in nights)) for i, c in enumerate(columns)]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths))]
    out += ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in nights]
    by_ds: dict = {}
    for ds, reason, n in reasons:
        by_ds.setdefault(ds, []).append(f"{reason} {n}")
    if by_ds:
        out += ["", "mask reasons by night:"] + [f"  {ds}: " + ", ".join(items) for ds, items in by_ds.items()]
    by_capture: dict = {}
    for ds, capture, n, masked in captures:
        by_capture.setdefault(ds, []).append(f"{capture} {n} ({masked / n:.1%} masked)")
    if by_capture:
        out += ["", "rollouts by capture:"] + [f"  {ds}: " + ", ".join(items) for ds, items in by_capture.items()]
    for ds in waiting:
        out.append(f"note: the publish of ds={ds} was interrupted; the next build or load finishes it")
    return "\n".join(out)
