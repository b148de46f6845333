"""pass@k from n rollouts with c passes (pure): the unbiased estimator 1 - C(n-c, k) / C(n, k).

It is the probability that k rollouts drawn without replacement from the n include a pass.
With no pass it is 0. When fewer than k rollouts failed (n - c < k, which includes rows
stopped early by --stop_after_passes after a pass) every draw of k holds a pass: 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1, got n={n} c={c} k={k}")
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(rows: Iterable[tuple[int, int]], k: int) -> float | None:
    """The mean of pass@k over rows given as (n, c); rows with n == 0 are left out. None: no rows."""
    return mean_pass_at_k_counted(Counter(rows), k)


def mean_pass_at_k_counted(rows: Mapping[tuple[int, int], int], k: int) -> float | None:
    """mean_pass_at_k over rows counted by their (n, c): a million rows have few distinct pairs."""
    total = sum(count for (n, _), count in rows.items() if n > 0)
    if not total:
        return None
    return sum(count * pass_at_k(n, c, k) for (n, c), count in rows.items() if n > 0) / total
