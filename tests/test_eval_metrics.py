"""Hand-worked checks of mimesis_jax.eval.metrics (Eq 14, 15, 16 and MR / Avg / ECE / Turing / SE)."""

import math

import pytest

from mimesis_jax.eval.metrics import (
    average,
    dice,
    dimension_score,
    ece,
    fidelity_index,
    mean_and_se,
    mean_rank,
    turing_distance,
    usi5,
)

TABLE = {
    #       g1   g2   g3
    "A": {"g1": 0.9, "g2": 0.3, "g3": 0.1},
    "B": {"g1": 0.9, "g2": 0.3, "g3": 0.4},
    "C": {"g1": 0.5, "g2": 0.3, "g3": 0.8},
}


def test_mean_rank_with_two_and_three_way_ties():
    # g1: A=B=0.9 tie for 1st -> both (1+2)/2 = 1.5; C 3rd -> 3
    # g2: A=B=C=0.3 three-way tie -> all (1+2+3)/3 = 2
    # g3: C=0.8 -> 1, B=0.4 -> 2, A=0.1 -> 3
    # MR A = (1.5+2+3)/3 = 6.5/3 ; B = (1.5+2+2)/3 = 5.5/3 ; C = (3+2+1)/3 = 2
    mr = mean_rank(TABLE)
    assert mr["A"] == pytest.approx(6.5 / 3)
    assert mr["B"] == pytest.approx(5.5 / 3)
    assert mr["C"] == pytest.approx(2.0)
    # ranks per gym always sum to 1+2+3 = 6, so MRs sum to 6
    assert sum(mr.values()) == pytest.approx(6.0)


def test_average_can_disagree_with_mean_rank():
    # A = (0.9+0.3+0.1)/3 = 1.3/3 ; B = (0.9+0.3+0.4)/3 = 1.6/3 ; C = (0.5+0.3+0.8)/3 = 1.6/3
    avg = average(TABLE)
    assert avg["A"] == pytest.approx(1.3 / 3)
    assert avg["B"] == pytest.approx(1.6 / 3)
    assert avg["C"] == pytest.approx(1.6 / 3)
    # B and C tie on Avg, but MR separates them (B 1.833 < C 2.0)
    mr = mean_rank(TABLE)
    assert mr["B"] < mr["C"]


def test_mean_rank_missing_gym_names_method_and_gym():
    bad = {"A": {"g1": 1.0, "g2": 0.5}, "B": {"g1": 0.2}}
    with pytest.raises(ValueError, match=r"'B'.*'g2'"):
        mean_rank(bad)
    with pytest.raises(ValueError, match=r"'B'.*'g2'"):
        average(bad)


def test_mean_rank_empty_table():
    with pytest.raises(ValueError):
        mean_rank({})
    with pytest.raises(ValueError):
        average({})


def _np_mean_rank(table, rtol=1e-9, atol=1e-12):
    """Independent NumPy reference: rank = 1 + #clearly-better + (#close-to-me - 1) / 2, averaged over gyms."""
    import numpy as np

    methods = list(table)
    gyms = sorted(next(iter(table.values())))
    s = np.array([[table[m][g] for g in gyms] for m in methods], dtype=np.float64)  # (M, G)
    close = np.abs(s[:, None, :] - s[None, :, :]) <= np.maximum(atol, rtol * np.maximum(np.abs(s[:, None, :]),
                                                                                     np.abs(s[None, :, :])))
    better = (s[None, :, :] > s[:, None, :]) & ~close  # [i, j, g]: j clearly beats i on g
    ranks = 1.0 + better.sum(axis=1) + (close.sum(axis=1) - 1) / 2.0
    return dict(zip(methods, ranks.mean(axis=1)))


def test_mean_rank_ties_within_tolerance_for_sums_in_different_orders():
    a = 0.1 + 0.1  # 0.2
    b = sum([0.1, 0.2, 0.3]) / 3  # 0.20000000000000004
    c = 0.3 - 0.1  # 0.19999999999999998
    assert a != b and a != c  # the floats differ: exact equality would rank them 1, 2 (and 3)
    two = {"A": {"g": a}, "B": {"g": b}}
    mr = mean_rank(two)
    assert mr == {"A": 1.5, "B": 1.5}
    assert mr == pytest.approx(_np_mean_rank(two))
    three = {"A": {"g": a, "h": 0.5}, "B": {"g": b, "h": 0.25}, "C": {"g": c, "h": 0.75}, "D": {"g": 0.1, "h": 0.5}}
    mr = mean_rank(three)
    ref = _np_mean_rank(three)
    # g: A, B, C tie for 1st-3rd -> 2 each, D 4th; h: C 1st, A = D tie 2nd-3rd -> 2.5, B 4th
    assert ref == pytest.approx({"A": 2.25, "B": 3.0, "C": 1.5, "D": 3.25})
    assert mr == pytest.approx(ref)


def test_mean_rank_tolerance_is_narrow():
    # differences well above rel 1e-9 / abs 1e-12 are real differences, not ties
    for lo, hi in [(0.2, 0.2 * (1 + 1e-7)), (0.0, 1e-10), (1e6, 1e6 + 1e-2)]:
        table = {"A": {"g": hi}, "B": {"g": lo}}
        assert mean_rank(table) == {"A": 1.0, "B": 2.0} == pytest.approx(_np_mean_rank(table))
    # and differences inside it tie: abs 1e-13 around 0, rel 1e-10 around 1e6
    for lo, hi in [(0.0, 1e-13), (1e6, 1e6 * (1 + 1e-10))]:
        table = {"A": {"g": hi}, "B": {"g": lo}}
        assert mean_rank(table) == {"A": 1.5, "B": 1.5} == pytest.approx(_np_mean_rank(table))


def test_dice_edge_cases():
    assert dice(0, 0) == 1.0  # both zero -> 1 by definition
    assert dice(0, 2) == 0.0  # 2*0/(0+2)
    assert dice(1, 3) == pytest.approx(0.5)  # 2*1/(1+3) = 2/4
    assert dice(3, 1) == pytest.approx(0.5)  # symmetric
    assert dice(0.4, 0.4) == pytest.approx(1.0)  # 2*0.4/0.8
    with pytest.raises(ValueError):
        dice(-1, 1)
    with pytest.raises(ValueError):
        dice(1, -0.1)


def test_dimension_score():
    # a: dice(0.2,0.2)=1 ; b: dice(0,0)=1 ; c: dice(0.5,1.5)=2*0.5/2.0=0.5
    # mean = 2.5/3 ; x100 = 83.333...
    sim = {"a": 0.2, "b": 0.0, "c": 0.5}
    hum = {"a": 0.2, "b": 0.0, "c": 1.5}
    assert dimension_score(sim, hum) == pytest.approx(250 / 3)
    with pytest.raises(ValueError, match=r"'x'.*'c'"):
        dimension_score({"a": 1, "b": 1, "x": 1}, hum)


def test_ece_hand_example_with_empty_bin():
    # 10 tasks. bins: b0=[0,.2) b1=[.2,.4) b2=[.4,.6) b3=[.6,.8) b4=[.8,1]
    difficulty = [0.05, 0.15, 0.2, 0.25, 0.35, 0.6, 0.75, 0.8, 0.9, 1.0]
    sim = [1, 0, 1, 1, 0, 1, 1, 0, 0, 1]
    human = [0, 0, 1, 0, 0, 1, 1, 1, 1, 1]
    # b0 (0.05, 0.15): sim mean 1/2, human 0     -> |.5|   * 2/10 = 0.1
    # b1 (0.2 on cutoff -> b1, 0.25, 0.35): sim 2/3, human 1/3 -> 1/3 * 3/10 = 0.1
    # b2: empty -> 0
    # b3 (0.6, 0.75): sim 1, human 1              -> 0
    # b4 (0.8, 0.9, 1.0): sim 1/3, human 1        -> 2/3 * 3/10 = 0.2
    # ECE = 0.1 + 0.1 + 0 + 0 + 0.2 = 0.4
    assert ece(sim, human, difficulty) == pytest.approx(0.4)
    assert ece(human, human, difficulty) == 0.0


def test_ece_errors():
    with pytest.raises(ValueError):
        ece([1, 0], [1], [0.1, 0.2])
    with pytest.raises(ValueError):
        ece([1], [1], [1.2])
    with pytest.raises(ValueError):
        ece([1], [1], [-0.1])


def test_usi5():
    # (80 + 70 + 60 + 90 + 100*(1-0.4)) / 5 = (300 + 60) / 5 = 72
    assert usi5(80, 70, 60, 90, 0.4) == pytest.approx(72.0)
    # perfect: (4*100 + 100*1)/5 = 100
    assert usi5(100, 100, 100, 100, 0.0) == pytest.approx(100.0)


def test_fidelity_index():
    # persona 3/4 -> 75 ; style 1/4 -> 25 ; pacing 4/4 -> 100 ; FI = 200/3
    fi, per = fidelity_index(
        {"persona": [1, 1, 0, 1], "style": [1, 0, 0, 0], "pacing": [1, 1, 1, 1]}
    )
    assert per == {"persona": 75.0, "style": 25.0, "pacing": 100.0}
    assert fi == pytest.approx(200 / 3)
    with pytest.raises(ValueError):
        fidelity_index({"persona": [1, 2]})
    with pytest.raises(ValueError):
        fidelity_index({})


def test_turing_distance():
    # 7 of 10 -> a = 70 -> |70-50| = 20 ; 3 of 10 -> a = 30 -> 20 ; 5 of 10 -> 0 ; all -> 50
    assert turing_distance([True] * 7 + [False] * 3) == pytest.approx(20.0)
    assert turing_distance([True] * 3 + [False] * 7) == pytest.approx(20.0)
    assert turing_distance([True, False] * 5) == 0.0
    assert turing_distance([True] * 4) == 50.0
    with pytest.raises(ValueError):
        turing_distance([])


def test_mean_and_se():
    # [1,2,3,4]: mean 2.5 ; sample var = (2.25+0.25+0.25+2.25)/3 = 5/3
    # SE = sqrt(5/3)/sqrt(4) = sqrt(5/12) ~= 0.6455
    m, se = mean_and_se([1, 2, 3, 4])
    assert m == pytest.approx(2.5)
    assert se == pytest.approx(math.sqrt(5 / 12))
    assert mean_and_se([3.0]) == (3.0, 0.0)
    with pytest.raises(ValueError):
        mean_and_se([])
