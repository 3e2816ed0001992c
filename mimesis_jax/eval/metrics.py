"""Evaluation metrics, implemented exactly as docs/reference/metrics.md defines them.

Equation numbers follow docs/reference/metrics.md (the paper's numbering): Eq 14 is the RealUserSim PT3 fidelity index,
Eq 15 the per-feature Dice similarity of the tau-bench User-Sim Index, Eq 16 the USI5 aggregate.
Everything here is plain Python (no JAX), so it can run anywhere and is cheap to test.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

__all__ = [
    "mean_rank",
    "TIE_REL_TOL",
    "TIE_ABS_TOL",
    "average",
    "dice",
    "dimension_score",
    "ECE_CUTOFFS",
    "ece",
    "usi5",
    "fidelity_index",
    "turing_distance",
    "mean_and_se",
]

# Difficulty bin cutoffs for ECE: bins are [0,0.2), [0.2,0.4), [0.4,0.6), [0.6,0.8), [0.8,1.0].
ECE_CUTOFFS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)

# Mean-rank tie tolerance: two scores tie when math.isclose(a, b, rel_tol=TIE_REL_TOL, abs_tol=TIE_ABS_TOL), so
# per-gym means that are equal up to float summation order (0.1 + 0.1 vs 0.05 + 0.15) share the mean rank.
TIE_REL_TOL: float = 1e-9
TIE_ABS_TOL: float = 1e-12


def _finite(x, what: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be a number, got {x!r}") from e
    if not math.isfinite(v):
        raise ValueError(f"{what} must be finite, got {x!r}")
    return v


def _check_table(table: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Validate a method -> gym -> score table; return the sorted list of gyms (every method has all)."""
    if not table:
        raise ValueError("empty table: no methods to aggregate")
    gyms: set[str] = set()
    for scores in table.values():
        gyms.update(scores)
    if not gyms:
        raise ValueError("empty table: no gym scores for any method")
    for method, scores in table.items():
        for gym in sorted(gyms):
            if gym not in scores:
                raise ValueError(f"method {method!r} has no score for gym {gym!r}")
            _finite(scores[gym], f"score of method {method!r} on gym {gym!r}")
    return sorted(gyms)


def mean_rank(table: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Mean rank MR (docs/reference/metrics.md, "Agent performance"; no equation number in the paper).

    ``table`` maps method -> gym -> score (higher is better). Within each gym the methods are ranked
    1 = best; tied methods share the mean of the ranks they span (two tied for first both get 1.5,
    three tied for 2nd-4th all get 3). MR of a method = mean of its ranks over all gyms.

    Ties are decided within a tolerance, not by exact float equality: scores a, b tie when
    ``math.isclose(a, b, rel_tol=TIE_REL_TOL, abs_tol=TIE_ABS_TOL)`` (1e-9, 1e-12), so means that differ only by
    summation order share a rank. Closeness is not transitive; a tie group starts at the best score not yet
    ranked and takes every following score close to that first one (no chaining through a run of near values).

    Raises ValueError for an empty table, or when a method lacks a gym that another method has
    (the message names both the method and the gym).
    """
    gyms = _check_table(table)
    ranks: dict[str, list[float]] = {m: [] for m in table}
    for gym in gyms:
        ordered = sorted(table, key=lambda m: -float(table[m][gym]))
        i = 0
        while i < len(ordered):
            j = i
            score = float(table[ordered[i]][gym])
            while j + 1 < len(ordered) and math.isclose(float(table[ordered[j + 1]][gym]), score,
                                                        rel_tol=TIE_REL_TOL, abs_tol=TIE_ABS_TOL):
                j += 1
            shared = (i + 1 + j + 1) / 2.0  # mean of 1-based ranks i+1 .. j+1
            for k in range(i, j + 1):
                ranks[ordered[k]].append(shared)
            i = j + 1
    return {m: sum(r) / len(r) for m, r in ranks.items()}


def average(table: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Mean score over gyms per method (Table 2 "Avg"; docs/reference/metrics.md, "Agent performance").

    Same validation as :func:`mean_rank`: every method must have every gym.
    """
    gyms = _check_table(table)
    return {m: sum(float(table[m][g]) for g in gyms) / len(gyms) for m in table}


def dice(m: float, h: float) -> float:
    """Eq 15: Dice = 2 min(M, H) / (M + H), with Dice = 1.0 when both M and H are 0.

    M is the simulator statistic and H the human statistic for one feature. Negative or non-finite
    inputs raise ValueError.
    """
    m = _finite(m, "simulator statistic M")
    h = _finite(h, "human statistic H")
    if m < 0 or h < 0:
        raise ValueError(f"Dice needs non-negative statistics, got M={m}, H={h}")
    if m == 0 and h == 0:
        return 1.0
    return 2.0 * min(m, h) / (m + h)


def dimension_score(sim_stats: Mapping[str, float], human_stats: Mapping[str, float]) -> float:
    """One User-Sim Index dimension: mean over its features of the Eq 15 Dice, times 100.

    Both arguments map feature -> statistic; their key sets must match (ValueError naming the
    features only on one side otherwise). Empty inputs raise ValueError.
    """
    sk, hk = set(sim_stats), set(human_stats)
    if sk != hk:
        raise ValueError(
            f"feature mismatch: only in simulator stats {sorted(sk - hk)}, "
            f"only in human stats {sorted(hk - sk)}"
        )
    if not sk:
        raise ValueError("no features to score")
    return 100.0 * sum(dice(sim_stats[f], human_stats[f]) for f in sk) / len(sk)


def ece(
    sim_success: Sequence[float], human_success: Sequence[float], difficulty: Sequence[float]
) -> float:
    """Expected calibration error of the simulator's success against humans (docs/reference/metrics.md, tau-bench USI).

    Inputs are equal-length per-task sequences: simulated success, human success (0/1 or rates in
    [0, 1], same agent) and task difficulty in [0, 1] (pooled success rate of reference simulators).
    Tasks go into 5 difficulty bins with cutoffs 0.2/0.4/0.6/0.8, i.e. [0,0.2), [0.2,0.4), [0.4,0.6),
    [0.6,0.8), [0.8,1.0] (a value on a cutoff goes to the upper bin; 1.0 goes to the last bin).

        ECE = sum_b (n_b / n) |mean sim success in b - mean human success in b|

    Empty bins contribute 0. Lower is better. Raises ValueError on length mismatch, empty input,
    difficulty outside [0, 1] or success values outside [0, 1].
    """
    n = len(difficulty)
    if len(sim_success) != n or len(human_success) != n:
        raise ValueError(
            f"length mismatch: sim_success={len(sim_success)}, human_success={len(human_success)}, "
            f"difficulty={n}"
        )
    if n == 0:
        raise ValueError("ECE needs at least one task")
    nbins = len(ECE_CUTOFFS) + 1
    sums = [[0, 0.0, 0.0] for _ in range(nbins)]  # count, sim sum, human sum
    for i in range(n):
        d = _finite(difficulty[i], f"difficulty[{i}]")
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"difficulty[{i}]={d} is outside [0, 1]")
        s = _finite(sim_success[i], f"sim_success[{i}]")
        h = _finite(human_success[i], f"human_success[{i}]")
        if not (0.0 <= s <= 1.0 and 0.0 <= h <= 1.0):
            raise ValueError(f"success values must be in [0, 1], got sim={s}, human={h} at task {i}")
        b = bisect.bisect_right(ECE_CUTOFFS, d)
        sums[b][0] += 1
        sums[b][1] += s
        sums[b][2] += h
    total = 0.0
    for nb, ss, hs in sums:
        if nb:
            total += (nb / n) * abs(ss / nb - hs / nb)
    return total


def usi5(d1: float, d2: float, d3: float, d4: float, ece: float) -> float:
    """Eq 16: USI5 = (D1 + D2 + D3 + D4 + 100 (1 - ECE)) / 5.

    D1..D4 are dimension scores on a 0-100 scale (see :func:`dimension_score`); ECE is in [0, 1].
    """
    ds = [_finite(d, f"D{i + 1}") for i, d in enumerate((d1, d2, d3, d4))]
    e = _finite(ece, "ECE")
    return (sum(ds) + 100.0 * (1.0 - e)) / 5.0


def fidelity_index(marks: Mapping[str, Sequence[int]]) -> tuple[float, dict[str, float]]:
    """Eq 14: RealUserSim PT3 fidelity index.

    ``marks`` maps dimension -> per-case judge marks m_{j,d} in {0, 1}. Dimension score
    = 100/N * sum_j m_{j,d} (N = number of cases for that dimension); FI = mean of the dimension
    scores. Returns (FI, {dimension: score}). Raises ValueError for no dimensions, a dimension with
    no cases, or a mark other than 0/1.
    """
    if not marks:
        raise ValueError("no dimensions to score")
    per_dim: dict[str, float] = {}
    for dim, ms in marks.items():
        ms = list(ms)
        if not ms:
            raise ValueError(f"dimension {dim!r} has no cases")
        for j, v in enumerate(ms):
            if v not in (0, 1):  # True/False compare equal to 1/0
                raise ValueError(f"mark {v!r} for case {j} of dimension {dim!r} is not 0/1")
        per_dim[dim] = 100.0 * sum(int(v) for v in ms) / len(ms)
    return sum(per_dim.values()) / len(per_dim), per_dim


def turing_distance(judge_correct: Sequence[bool]) -> float:
    """SimulatorArena Turing distance: |a - 50| with a = 100 * mean(judge_correct) (docs/reference/metrics.md).

    In [0, 50]; lower is better (0 = judge at chance). Empty input raises ValueError.
    """
    vals = list(judge_correct)
    if not vals:
        raise ValueError("Turing distance needs at least one judged pair")
    for i, v in enumerate(vals):
        if v not in (0, 1):
            raise ValueError(f"judge_correct[{i}]={v!r} is not a bool")
    a = 100.0 * sum(bool(v) for v in vals) / len(vals)
    return abs(a - 50.0)


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error over seeds: SE = sample std (n - 1 denominator) / sqrt(n); 0 for n = 1.

    Returns (mean, se). Empty input raises ValueError.
    """
    xs = [_finite(v, f"values[{i}]") for i, v in enumerate(values)]
    n = len(xs)
    if n == 0:
        raise ValueError("mean_and_se needs at least one value")
    mean = sum(xs) / n
    if n == 1:
        return mean, 0.0
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(var) / math.sqrt(n)
