"""Hand-written nights for the tests: tokens spelled out, files written as a harness would."""

from __future__ import annotations

from pathlib import Path

from reassembler.producer.capture import CapturedCall, TokenFileTypes, stage_rollout, write_jsonl, write_token_file
from reassembler.producer.gym_local import local_entries, rebuilt_output, write_local_capture

DS = "2026-11-28"


def reasoning(text: str, item_id: str | None = None) -> dict:
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
    if item_id:
        item["id"] = item_id
    return item


def answer(text: str, item_id: str | None = None) -> dict:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    if item_id:
        item["id"] = item_id
    return item


def tool_output(text: str) -> dict:
    return {"type": "function_call_output", "call_id": "t", "output": text}


def call(call_id, parent, prompt, generated, items, logprob=-0.5, weight_version=0, poison=None):
    """A call whose delta is `prompt` (mask 0) then `generated` (mask 1)."""
    ids = list(prompt) + list(generated)
    mask = [0.0] * len(prompt) + [1.0] * len(generated)
    lps = [0.0] * len(prompt) + [logprob] * len(generated)
    return CapturedCall(call_id, parent, ids, mask, lps, items, weight_version, poison)


class Night:
    """Collects rollouts, then writes rollouts / ledger / tokens partitions of one ds."""

    def __init__(self, root: Path, ds: str = DS):
        self.root, self.ds = Path(root), ds
        self.rollouts: list[dict] = []
        self.ledger: list[dict] = []
        self.tokens: list[dict] = []
        self.local: dict[str, list] = {}  # NeMo Gym local mode: rollout id -> its entries (dicts or line bytes)
        self.local_files: dict[str, dict] = {}  # rollout id -> write_local_capture's other arguments

    def add(
        self,
        rollout_id: str,
        calls: list[CapturedCall],
        output: list[dict],
        reward: float = 1.0,
        group_id: str | None = None,
        slot: int | None = None,
        evidence: str = "items",
        **record,
    ) -> tuple[list[dict], list[dict]]:
        """`evidence`: "items" (output_items) or "fingerprint" (NeMo Gym's output_fingerprint)."""
        group, _, s = rollout_id.rpartition("_g")
        self.rollouts.append(
            {
                "rollout_id": rollout_id,
                "group_id": group_id or group,
                "slot": slot if slot is not None else int(s),
                "reward": reward,
                "output": output,
                **record,
            }
        )
        staged = stage_rollout(rollout_id, calls, evidence=evidence)
        ledger = [l for l, _ in staged]
        tokens = [t for _, t in staged if t is not None]
        self.ledger.extend(ledger)
        self.tokens.extend(tokens)
        return ledger, tokens

    def add_local(
        self, rollout_id: str, calls: list[CapturedCall], output: list[dict], reward: float = 1.0, delta=False, **record
    ) -> list[dict]:
        """A rollout captured in NeMo Gym's local mode (its entries are returned, to change
        before `write`), its result line as Gym writes it (`response.output`, `response.id`
        the last call's)."""
        group, _, s = rollout_id.rpartition("_g")
        self.rollouts.append(
            {
                "rollout_id": rollout_id,
                "group_id": record.pop("group_id", group),
                "slot": record.pop("slot", None) if "slot" in record else int(s),
                "reward": reward,
                "response": {"id": f"resp_{calls[-1].call_id}", "output": output},
                **record,
            }
        )
        self.local[rollout_id] = local_entries(rollout_id, calls, delta)
        return self.local[rollout_id]

    def add_rebuilt(self, rollout_id: str, calls: list[CapturedCall], reward: float = 1.0, **record) -> dict:
        """A result line NeMo Gym rebuilt itself from the chain `calls` (CONTRACT.md 9.10)."""
        group, _, s = rollout_id.rpartition("_g")
        line = {
            "rollout_id": rollout_id,
            "group_id": group,
            "slot": int(s),
            "reward": reward,
            "response": {"id": f"resp_{calls[-1].call_id}", "output": rebuilt_output(calls)},
            "_ng_token_capture": {"chains": 1, "delivered_fraction": 1.0},
            **record,
        }
        self.rollouts.append(line)
        return line

    def write(self, types: TokenFileTypes = TokenFileTypes()) -> Path:
        base = self.root / "input"
        write_jsonl(base / "rollouts" / f"ds={self.ds}" / "rollouts.jsonl", self.rollouts)
        if self.ledger or not self.local:  # a night of local-mode capture only has no ledger files
            write_jsonl(base / "ledger" / f"ds={self.ds}" / "ledger.jsonl", self.ledger)
            write_token_file(base / "tokens" / f"ds={self.ds}" / "tokens.parquet", self.tokens, types)
        for rollout_id, entries in self.local.items():
            write_local_capture(
                base / "ledger" / f"ds={self.ds}", rollout_id, entries, **self.local_files.get(rollout_id, {})
            )
        return base


def worked_calls(compaction: bool = True) -> tuple[list[CapturedCall], list[dict]]:
    """CONTRACT.md section 7's five calls, tokens spelled out, and the agent's output."""
    c1 = call("c1", None, [101, 102, 103], [11, 12], [reasoning("r1"), answer("a1")])
    c2 = call("c2", "c1", [201], [21, 22], [reasoning("r2"), answer("a2")])
    if compaction:
        c3 = call("c3", None, [301, 302], [31], [reasoning("r3"), answer("a3")])
        c4 = call("c4", "c3", [401], [41], [reasoning("r4"), answer("a4")])
        c5 = call("c5", "c3", [501, 502], [51, 52], [reasoning("r5"), answer("a5")])
        output = [reasoning("r1"), answer("a1"), tool_output("o1"), reasoning("r2"), answer("a2")]
        output += [reasoning("r3"), answer("a3"), tool_output("o3"), reasoning("r5"), answer("a5")]
    else:
        c3 = call("c3", "c2", [301, 302], [31], [reasoning("r3"), answer("a3")])
        c4 = call("c4", "c3", [401], [41], [reasoning("r4"), answer("a4")])
        c5 = call("c5", "c4", [501, 502], [51, 52], [reasoning("r5"), answer("a5")])
        output = [item for k in range(1, 6) for item in (reasoning(f"r{k}"), answer(f"a{k}"))]
    return [c1, c2, c3, c4, c5], output


def worked_example(night: Night, rollout_id: str = "group_g0", compaction: bool = True, **record):
    """CONTRACT.md section 7, staged. Returns (ledger rows, token rows)."""
    calls, output = worked_calls(compaction)
    return night.add(rollout_id, calls, output, **record)


def worked_example_local(night: Night, rollout_id: str = "group_g0", compaction: bool = True, delta=False, **record):
    """The worked example captured in NeMo Gym's local mode. Returns its entries."""
    calls, output = worked_calls(compaction)
    return night.add_local(rollout_id, calls, output, delta=delta, **record)


def partition_parts(folder) -> dict[str, bytes]:
    """A published partition's files by shard (`part-<run>-<shard>.parquet` -> <shard>), with
    their bytes: equal for two runs that wrote the same rows, whatever their run ids."""
    from pathlib import Path

    return {p.name.rsplit("-", 1)[-1]: p.read_bytes() for p in sorted(Path(folder).glob("part-*.parquet"))}
