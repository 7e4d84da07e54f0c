"""Statistics for evaluation runs: intervals, pass@k, and paired comparisons of two runs.

On 100-task subsets one standard error of a success rate is about ±4–5 points (SEAL_METHOD.md §6),
so every rate seal-rl reports comes with an interval, and run comparisons are paired by task.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% by default); (0, 1) when n = 0.

    >>> [round(x, 4) for x in wilson(8, 10)]
    [0.4902, 0.9433]
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, not rounding residue
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mean_interval(rates: Sequence[tuple[int, int]], z: float = Z95) -> tuple[float, float, float]:
    """The unweighted mean of several success rates (the paper's "Average") with an interval.

    rates: (successes, n) per category. The interval is the adjusted Wald interval for a linear
    function of binomial proportions (Price & Bonett 2004): each of the m rates gets z²/(2m)
    extra successes in z²/m extra trials, then Var(mean) = Σ p̃(1−p̃)/ñ / m². Unlike the plain
    normal interval it does not collapse to a point when every rate is 0 or 1.
    """
    parts = [(s, n) for s, n in rates if n]
    if not parts:
        return 0.0, 0.0, 1.0
    m = len(parts)
    mean = sum(s / n for s, n in parts) / m
    adjusted = [((s + z * z / (2 * m)) / (n + z * z / m), n + z * z / m) for s, n in parts]
    centre = sum(p for p, _ in adjusted) / m
    se = math.sqrt(sum(p * (1 - p) / n for p, n in adjusted)) / m
    return mean, max(0.0, centre - z * se), min(1.0, centre + z * se)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes: 1 − C(n−c, k) / C(n, k) (Chen et al. 2021).

    >>> pass_at_k(4, 1, 2)
    0.5
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of b vs c discordant pairs at p = 1/2.

    b: pairs where only A succeeded; c: pairs where only B succeeded.

    >>> round(mcnemar_exact(1, 9), 4)
    0.0215
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedComparison:
    """Run B against run A on the episodes they share (by task and sample)."""

    pairs: int
    rate_a: float
    rate_b: float
    only_a: int
    only_b: int
    p_value: float

    @property
    def difference(self) -> float:
        return self.rate_b - self.rate_a


def paired(a: Mapping[str, bool], b: Mapping[str, bool]) -> PairedComparison:
    """Paired outcomes keyed by episode (task id + sample); only keys present in both count."""
    keys = sorted(set(a) & set(b))
    only_a = sum(1 for k in keys if a[k] and not b[k])
    only_b = sum(1 for k in keys if b[k] and not a[k])
    n = len(keys)
    rate_a = sum(a[k] for k in keys) / n if n else 0.0
    rate_b = sum(b[k] for k in keys) / n if n else 0.0
    return PairedComparison(n, rate_a, rate_b, only_a, only_b, mcnemar_exact(only_a, only_b))


def bootstrap_average_difference(
    by_category: Mapping[str, Sequence[tuple[bool, bool]]],
    *,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """Paired bootstrap of the difference in average success (B − A), tasks resampled within category.

    by_category: for each category, (A succeeded, B succeeded) per shared episode. The average is
    the unweighted mean over categories, as the paper reports it. Returns (estimate, low, high).
    """
    cats = {k: list(v) for k, v in by_category.items() if v}
    if not cats:
        return 0.0, 0.0, 0.0

    def average(samples: Mapping[str, Sequence[tuple[bool, bool]]]) -> float:
        return sum(sum(b - a for a, b in v) / len(v) for v in samples.values()) / len(samples)

    rng = random.Random(seed)
    estimates = sorted(
        average({k: rng.choices(v, k=len(v)) for k, v in cats.items()}) for _ in range(resamples)
    )
    tail = (1 - level) / 2
    low = estimates[int(tail * (resamples - 1))]
    high = estimates[int((1 - tail) * (resamples - 1))]
    return average(cats), low, high


@dataclass(frozen=True)
class RunComparison:
    """Run B against run A, paired by (task, sample), per category and overall."""

    categories: dict[str, PairedComparison]
    overall: PairedComparison
    average_difference: tuple[float, float, float]
    """(estimate, low, high) of the difference in the average of category rates, paired bootstrap"""
    only_in_a: int
    only_in_b: int


def compare_runs(a: Sequence[Mapping], b: Sequence[Mapping], *, resamples: int = 10_000, seed: int = 0) -> RunComparison:
    """Compare two runs' episode records (``results.jsonl`` lines); generation errors are left out."""

    def outcomes(records: Sequence[Mapping]) -> dict[tuple[str, int], tuple[str, bool]]:
        return {(r["task_id"], r.get("sample", 0)): (r["category"], r["reward"] == 1.0) for r in records if not r.get("error")}

    left, right = outcomes(a), outcomes(b)
    first_seen = {category: i for i, category in reversed(list(enumerate(r["category"] for r in a)))}  # run A's order
    shared = sorted(set(left) & set(right))
    by_category: dict[str, list[tuple[bool, bool]]] = {}
    for key in shared:
        by_category.setdefault(left[key][0], []).append((left[key][1], right[key][1]))
    categories = {
        category: paired({str(i): p[0] for i, p in enumerate(pairs)}, {str(i): p[1] for i, p in enumerate(pairs)})
        for category, pairs in sorted(by_category.items(), key=lambda item: first_seen[item[0]])
    }
    overall = paired({str(k): left[k][1] for k in shared}, {str(k): right[k][1] for k in shared})
    return RunComparison(
        categories=categories,
        overall=overall,
        average_difference=bootstrap_average_difference(by_category, resamples=resamples, seed=seed),
        only_in_a=len(set(left) - set(right)),
        only_in_b=len(set(right) - set(left)),
    )
