"""One advantage per rollout (CONTRACT.md 3.4), by hand: the expected values are written
out with their arithmetic and compared exactly (==), so the +1e-6 or the population std
cannot change unseen."""

import math

from reassembler.verify.advantage import group_advantages


def test_grpo_advantage_uses_population_std_plus_1e_6():
    # rewards 1, 0, 0.5, 0.5: mean 0.5; population variance (0.25 + 0.25 + 0 + 0) / 4 = 0.125
    std = math.sqrt(0.125)
    assert group_advantages([1.0, 0.0, 0.5, 0.5]) == [0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.0, 0.0]
    assert group_advantages([1.0, 0.0, 0.5, 0.5])[0] == 1.4142095623844086  # not 1/sqrt(0.125) = 1.41421356...


def test_no_std_normalisation_and_leave_one_out():
    assert group_advantages([1.0, 0.0, 0.5], std_normalize=False) == [0.5, -0.5, 0.0]
    # leave-one-out: each rollout's baseline is the mean of the others; the divisor stays the
    # group's population std: sqrt(((0.5)^2 + (0.5)^2 + 0) / 3) = sqrt(1/6)
    std = math.sqrt(1 / 6)
    assert group_advantages([1.0, 0.0, 0.5], leave_one_out=True) == [
        (1.0 - 0.25) / (std + 1e-6),
        (0.0 - 0.75) / (std + 1e-6),
        (0.5 - 0.5) / (std + 1e-6),
    ]
    assert group_advantages([1.0, 0.0], std_normalize=False, leave_one_out=True) == [1.0, -1.0]


def test_single_valid_rollout_gets_zero():
    assert group_advantages([0.7]) == [0.0]
    assert group_advantages([0.7], leave_one_out=True) == [0.0]
