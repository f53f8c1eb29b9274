"""One advantage per rollout, GRPO style (CONTRACT.md 3.4).

Over the valid rollouts of a group: (reward - mean) / (std + 1e-6), population std.
Options: no std normalisation (reward - mean); leave-one-out mean (the mean of the other
valid rollouts of the group; std stays the group's). A group with one valid rollout gets 0.
Masked rollouts take no part and get no advantage.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-6


def group_advantages(
    rewards: list[float] | np.ndarray, std_normalize: bool = True, leave_one_out: bool = False
) -> list[float]:
    r = np.asarray(rewards, dtype=np.float64)
    n = len(r)
    if n <= 1:
        return [0.0] * n
    mean = (r.sum() - r) / (n - 1) if leave_one_out else np.full(n, r.mean())
    adv = r - mean
    if std_normalize:
        adv = adv / (r.std() + EPS)
    return adv.tolist()


def assign_advantages(outcomes, std_normalize: bool = True, leave_one_out: bool = False) -> None:
    """Set `advantage` on every ok outcome; `outcomes` hold whole groups."""
    groups: dict[str, list] = {}
    for o in outcomes:
        if o.ok:
            groups.setdefault(o.rollout["group_id"], []).append(o)
    for members in groups.values():
        values = group_advantages([o.rollout["reward"] for o in members], std_normalize, leave_one_out)
        for o, a in zip(members, values):
            o.advantage = a
