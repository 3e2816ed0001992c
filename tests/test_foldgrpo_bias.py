"""experiments/foldgrpo_bias.py: FoldGRPO (docs/reference/paper.md §3.3) vs naive per-segment statistics on a hand-made group,
checked against values computed by hand from the formula (mean and unbiased std over the first segment seen per
rollout id; A = (S - mean) / (std + 1e-6), broadcast to every segment of the rollout)."""

import importlib.util
import math
import os

import numpy as np
import pytest

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "foldgrpo_bias.py")
_spec = importlib.util.spec_from_file_location("foldgrpo_bias", _PATH)
fb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fb)

EPS = 1e-6


def test_hand_group_fold_vs_naive():
    # group 7: rollouts with 1, 3 and 2 segments, scores 1.0, 0.0, 0.5; group 9: one rollout with 2 segments
    seg_s, seg_g, seg_r = fb.make_segments([1, 3, 2, 2], [1.0, 0.0, 0.5, 0.3], [7, 7, 7, 9])
    assert seg_s.tolist() == [1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.3, 0.3]
    assert seg_r.tolist() == [0, 1, 1, 1, 2, 2, 3, 3]

    # FoldGRPO by hand: members 1.0, 0.0, 0.5 -> mean 0.5, unbiased var (0.25 + 0.25 + 0) / 2 = 0.25, std 0.5
    m_f, sd_f = 0.5, 0.5
    # naive by hand: members 1, 0, 0, 0, .5, .5 -> mean 2/6 = 1/3;
    # squared deviations (2/3)^2 + 3 (1/3)^2 + 2 (1/6)^2 = 4/9 + 3/9 + 1/18 = 5/6, / (6 - 1) = 1/6
    m_n, sd_n = 1 / 3, math.sqrt(1 / 6)

    stats_f = fb.group_stats(seg_s, seg_g, seg_r)
    stats_n = fb.group_stats(seg_s, seg_g, None)
    assert stats_f[7] == pytest.approx((m_f, sd_f), abs=1e-12)
    assert stats_n[7] == pytest.approx((m_n, sd_n), abs=1e-12)
    assert stats_f[9] == (0.0, 1.0)                      # one rollout: mean 0, std 1
    assert stats_n[9] == pytest.approx((0.3, 0.0))       # naive: its two segments look like two members

    a_fold, a_naive = fb.fold_and_naive(seg_s, seg_g, seg_r)
    A = [(1.0 - m_f) / (sd_f + EPS), (0.0 - m_f) / (sd_f + EPS), (0.5 - m_f) / (sd_f + EPS)]  # [~1, ~-1, 0]
    want_fold = [A[0], A[1], A[1], A[1], A[2], A[2]] + [0.3 / (1.0 + EPS)] * 2  # group 9: (0.3 - 0) / (1 + eps)
    np.testing.assert_allclose(a_fold, want_fold, rtol=0, atol=1e-12)
    want_naive = [(s - m_n) / (sd_n + EPS) for s in [1.0, 0.0, 0.0, 0.0, 0.5, 0.5]] + [0.0, 0.0]
    np.testing.assert_allclose(a_naive, want_naive, rtol=0, atol=1e-12)
    assert not np.allclose(a_fold[:6], a_naive[:6])
    # every segment of a rollout gets that rollout's advantage (both ways); FoldGRPO is zero-sum over rollouts
    A_f = fb.first_segment(a_fold, seg_r, 4)
    np.testing.assert_allclose(A_f[:3].sum(), 0.0, atol=1e-9)
    M_f = fb.per_rollout(a_fold, seg_r, 4)
    np.testing.assert_allclose(M_f, np.array([1, 3, 2, 2]) * A_f, atol=1e-12)
    # naive is zero-sum over segments of group 7, hence not over its rollouts
    assert abs(a_naive[:6].sum()) < 1e-9
    assert abs(fb.first_segment(a_naive, seg_r, 4)[:3].sum()) > 0.1


def test_first_seen_segment_defines_the_statistics():
    # rollout 0's segments carry different scores, interleaved with rollout 1's: only the first (0.8) counts
    seg_s = np.array([0.8, 0.2, 0.0, 0.4])
    seg_g = np.zeros(4, int)
    seg_r = np.array([0, 1, 0, 1])
    m = (0.8 + 0.2) / 2
    sd = math.sqrt(((0.8 - m) ** 2 + (0.2 - m) ** 2) / 1)
    assert fb.group_stats(seg_s, seg_g, seg_r)[0] == pytest.approx((m, sd), abs=1e-12)
    a_fold, _ = fb.fold_and_naive(seg_s, seg_g, seg_r)
    np.testing.assert_allclose(a_fold, (seg_s - m) / (sd + EPS), atol=1e-12)


def test_script_runs_small(capsys):
    res = fb.main(["--groups", "50", "--group-size", "4", "--seed", "1"])
    out = capsys.readouterr().out
    assert "| scenario |" in out and "Interpretation:" in out
    for r in res.values():
        assert r["sumA_fold"] < 1e-9 and r["sumM_naive"] < 1e-9
    assert res["long_good"]["baseline_shift"] > 0 > res["long_bad"]["baseline_shift"]
