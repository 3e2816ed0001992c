"""experiments/async_learning.py: its statistics against values worked out by hand from the formulas (or scipy's
own implementations where a quantile is not a table value), its censoring, and the table it prints."""

import importlib.util
import math
import os

import numpy as np
import pytest
from scipy import stats

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "async_learning.py")
_spec = importlib.util.spec_from_file_location("async_learning", _PATH)
al = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(al)

T975_DF2 = 4.302652729911275  # Student-t 0.975 quantile, 2 degrees of freedom (printed tables: 4.303)
T975_DF4 = 2.7764451051977987  # 4 degrees of freedom (tables: 2.776)


def test_first_reach_and_censoring():
    assert al.first_reach([0.1, 0.85, 0.9], 0.8, 3) == (2, True)
    assert al.first_reach([0.1, 0.8], 0.8, 5) == (2, True)  # reaching is >=
    assert al.first_reach([0.1, 0.79], 0.8, 2) == (3, False)  # censored: max_steps + 1
    assert al.first_reach([0.1, 0.2, 0.9], 0.8, 2) == (3, False)  # a value past max_steps does not count


def test_t_interval_by_hand():
    # [1, 2, 3]: mean 2, s = 1, n = 3 -> 2 +/- t(0.975, 2) / sqrt(3)
    lo, hi = al.t_interval([1, 2, 3])
    h = T975_DF2 / math.sqrt(3)
    assert (lo, hi) == pytest.approx((2 - h, 2 + h), abs=1e-9)
    assert al.t_interval([7]) == (7.0, 7.0)


def test_welch_interval_by_hand_and_against_scipy():
    # equal sizes and variances: s^2/n = 1/3 each, df = (2/3)^2 / (2 (1/3)^2 / 2) = 4
    d, lo, hi = al.welch_interval([1, 2, 3], [4, 5, 6])
    h = T975_DF4 * math.sqrt(2 / 3)
    assert (d, lo, hi) == pytest.approx((-3, -3 - h, -3 + h), abs=1e-9)
    # unequal variances: df 50/17 by Welch-Satterthwaite; scipy's Welch test gives the same interval
    x, y = [1, 2, 3], [2, 4, 6]
    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    d, lo, hi = al.welch_interval(x, y)
    assert (d, lo, hi) == pytest.approx((-2, ci.low, ci.high), abs=1e-9)
    assert al.welch_interval([3, 3], [2, 2]) == (1.0, 1.0, 1.0)


def test_mann_whitney_by_hand():
    assert al.mann_whitney_u([1, 2], [3, 4]) == 0
    assert al.mann_whitney_u([1, 2], [2, 3]) == 0.5  # the tie 2 = 2 counts half
    # splits of {1, 2, 3, 4} into two pairs: U = 0, 1, 2, 2, 3, 4 around n m / 2 = 2; |0 - 2| is matched by 0 and 4
    assert al.mann_whitney_p([1, 2], [3, 4]) == pytest.approx(2 / 6)
    assert al.mann_whitney_p([1, 4], [2, 3]) == pytest.approx(1.0)  # U = 2, the centre


def test_mann_whitney_p_against_scipy_exact():
    x, y = [1, 5, 7, 9], [2, 3, 4, 6, 8]
    ref = stats.mannwhitneyu(x, y, alternative="two-sided", method="exact")
    assert al.mann_whitney_u(x, y) == ref.statistic
    assert al.mann_whitney_p(x, y) == pytest.approx(ref.pvalue, abs=1e-12)


def test_table_counts_censored_runs():
    runs = [{"arm": 0, "seed": 0, "steps": 3, "reached": True}, {"arm": 0, "seed": 1, "steps": 5, "reached": True},
            {"arm": 2, "seed": 0, "steps": 4, "reached": True}, {"arm": 2, "seed": 1, "steps": 11, "reached": False}]
    rows = al.table(runs, max_steps=10, threshold=0.8).splitlines()
    assert len(rows) == 4  # header, rule, arms 0 and 2 (arm 1 has no run)
    cells0 = [c.strip() for c in rows[2].strip("|").split("|")]
    lo, hi = al.t_interval([3, 5])
    assert cells0 == ["0", "2/2", f"4.0 [{lo:.1f}, {hi:.1f}]", "4.0", "-", "-", "3 5"]
    cells2 = [c.strip() for c in rows[3].strip("|").split("|")]
    d, dl, dh = al.welch_interval([4, 11], [3, 5])
    assert cells2[:2] == ["2", "1/2"] and cells2[-1] == "4 11+"
    assert cells2[4] == f"{d:+.1f} [{dl:+.1f}, {dh:+.1f}]"
    assert cells2[5] == f"{al.mann_whitney_p([4, 11], [3, 5]):.3f}"
    assert np.isclose(d, 3.5)
