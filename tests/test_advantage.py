"""One advantage per rollout (CONTRACT.md 3.4), by hand."""

import pytest

from reassembler.advantage import group_advantages


def test_grpo_advantage_uses_population_std():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5])
    mean, std = 0.5, (0.125) ** 0.5
    assert adv == pytest.approx([(r - mean) / (std + 1e-6) for r in (1.0, 0.0, 0.5, 0.5)])


def test_options_no_std_and_leave_one_out():
    assert group_advantages([1.0, 0.0, 0.5], std_normalize=False) == pytest.approx([0.5, -0.5, 0.0])
    # leave-one-out: mean of the others; std stays the group's population std
    std = (1 / 6) ** 0.5
    assert group_advantages([1.0, 0.0, 0.5], leave_one_out=True) == pytest.approx(
        [(1.0 - 0.25) / (std + 1e-6), (0.0 - 0.75) / (std + 1e-6), 0.0]
    )
    assert group_advantages([1.0, 0.0], std_normalize=False, leave_one_out=True) == [1.0, -1.0]


def test_single_valid_rollout_gets_zero():
    assert group_advantages([0.7]) == [0.0]
    assert group_advantages([0.7], leave_one_out=True) == [0.0]
