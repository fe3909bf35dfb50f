import math

import numpy as np
import pytest

from pflarena.core.evaluation import accuracy_stats, worst_fraction_mean


def test_stats_by_hand():
    # Accuracies 0.5, 1.0, 0.25, 0.75 on 10, 2, 4, 4 samples.
    stats = accuracy_stats([5, 2, 1, 3], [10, 2, 4, 4], [10.0, 1.0, 4.0, 5.0])
    assert stats.mean == pytest.approx(0.625)
    assert stats.weighted == pytest.approx(11 / 20)
    assert stats.std == pytest.approx(np.std([0.5, 1.0, 0.25, 0.75]))
    assert stats.worst10 == pytest.approx(0.25)  # ceil(0.4) = 1 client
    assert stats.loss == pytest.approx(20 / 20)
    assert stats.num_clients == 4


def test_worst10_uses_ceil_of_ten_percent():
    values = list(np.linspace(0, 1, 20))  # 2 worst of 20
    assert worst_fraction_mean(values) == pytest.approx((values[0] + values[1]) / 2)


def test_clients_without_test_data_are_skipped():
    stats = accuracy_stats([1, 0], [2, 0], [1.0, 0.0])
    assert stats.num_clients == 1 and stats.mean == pytest.approx(0.5)
    empty = accuracy_stats([0], [0], [0.0])
    assert empty.num_clients == 0 and math.isnan(empty.mean)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        accuracy_stats([1, 2], [3], [0.0, 0.0])
