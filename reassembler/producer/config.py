"""The knobs of a synthetic night (synth.py), apart so that the command line can show
their defaults without importing numpy and pyarrow."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SynthConfig:
    rollouts: int = 240
    group_size: int = 4
    seed: int = 7
    fault_rate: float = 0.2
    min_calls: int = 5
    max_calls: int = 40
    compaction_rate: float = 0.3
    retry_rate: float = 0.05
    poison_rate: float = 0.05
    prompt_tokens: tuple[int, int] = (300, 2000)
    observation_tokens: tuple[int, int] = (20, 1200)
    generated_tokens: tuple[int, int] = (40, 700)
    vocab: int = 151_936
    # plain, lineage, gym (staged), local (Gym's local mode), rebuilt (lines Gym rebuilt
    # itself), verifiers (traces.jsonl)
    shape_shares: tuple[float, ...] = (0.26, 0.08, 0.3, 0.13, 0.08, 0.07, 0.08)
    only_shape: str | None = None  # every group in this shape (the draws stay the same)
    local_delta: float = 0.5  # share of local-mode rollouts written with delta prompts
    rollouts_per_ledger_file: int = 50
    token_rows_per_file: int = 1000
