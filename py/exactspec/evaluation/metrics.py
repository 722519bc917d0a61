"""Pure maths of the evaluation (the specification's cost model): survival S_i and conditional
acceptance a_i, E[G(k)], per-token costs, predicted speed-up, break-even length N_min, ECDF,
Pareto frontier, a chi-square homogeneity test. No I/O."""
from __future__ import annotations

import math
import statistics


def survival(rounds, k_max: int) -> dict:
    """rounds: (proposed, accepted) per speculative round. a_i = P(position i accepted | rounds
    that proposed i and accepted 1..i-1); S_i = a_1...a_i (no independence assumed: each a_i is
    conditional on survival). {"a": [a_1..], "S": [S_1..], "at_risk": [n_1..]}; None where no
    round reached the position (and every S after it), except that S stays 0 once it is 0."""
    a, s_list, at_risk, s = [], [], [], 1.0
    for i in range(1, k_max + 1):
        reached = sum(1 for m, n in rounds if m >= i and n >= i - 1)
        took = sum(1 for m, n in rounds if m >= i and n >= i)
        at_risk.append(reached)
        a.append(took / reached if reached else None)
        if s != 0.0:
            s = None if reached == 0 or s is None else s * took / reached
        s_list.append(s)
    return {"a": a, "S": s_list, "at_risk": at_risk}


def expected_tokens(S: list, k: int):
    """E[G(k)] = 1 + S_1 + ... + S_k (tokens a round emits, ignoring terminal truncation); None
    when some S_i with i <= k is unknown."""
    head = S[:k]
    if len(head) < k or any(x is None for x in head):
        return None
    return 1.0 + sum(head)


def spec_cost_per_token(draft_ms_per_proposal: float, k: int, verify_ms: float, overhead_ms: float, eg: float) -> float:
    """C_spec(k) = (k d + V(k) + overhead) / E[G(k)]: the expected round cost over tokens a round."""
    return (k * draft_ms_per_proposal + verify_ms + overhead_ms) / eg


def iid_expected_tokens(a: float, k: int) -> float:
    """E[G(k)] when every proposal is accepted with probability a, independently of the others:
    1 + a + ... + a^k."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def iid_speedup(a: float, k: int, alone_ms_per_token: float, verify_ms: float, draft_ms_per_proposal: float,
                overhead_ms: float) -> float:
    """Champion alone's ms per token over draft k's, E[G(k)] c_alone / (V(k+1) + k d + o), at a per-token
    acceptance a (verify_ms = V(k+1), the champion's time for the round's k + 1 rows)."""
    return iid_expected_tokens(a, k) * alone_ms_per_token / (verify_ms + k * draft_ms_per_proposal + overhead_ms)


def acceptance_for(target: float, k: int, alone_ms_per_token: float, verify_ms: float, draft_ms_per_proposal: float,
                   overhead_ms: float):
    """The per-token acceptance a at which draft k reaches speed-up `target` (iid_speedup rises with
    a): bisection to 1e-4; 0.0 when even a = 0 reaches it, None when even a = 1 (every proposal
    accepted) does not."""
    f = lambda a: iid_speedup(a, k, alone_ms_per_token, verify_ms, draft_ms_per_proposal, overhead_ms)
    if f(1.0) < target:
        return None
    if f(0.0) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return hi


def acceptance_mle(rounds) -> tuple:
    """Per-token acceptance from (proposed, accepted) rounds, proposals taken as independent trials
    that stop at the first rejection: (accepted / trials, trials), trials = accepted + (1 if the
    round rejected one, i.e. accepted < proposed); (None, 0) without trials."""
    took = sum(n for m, n in rounds if m > 0)
    trials = sum(n + (1 if n < m else 0) for m, n in rounds if m > 0)
    return (took / trials if trials else None), trials


def speedup(baseline: float, other: float):
    """baseline / other (times or per-token costs), None when either is missing or other <= 0."""
    if baseline is None or other is None or other <= 0:
        return None
    return baseline / other


def n_min(fixed_ms: float, alone_ms_per_token: float, spec_ms_per_token: float):
    """N_min = F / (C_t(1) - C_spec): tokens after which the draft's fixed cost F (its load and
    prefill) is paid back; math.inf when speculation is not cheaper per token (never amortises)."""
    gain = alone_ms_per_token - spec_ms_per_token
    if gain <= 0:
        return math.inf
    return max(fixed_ms, 0.0) / gain


def latency_ratio(n: int, spec_fixed_ms: float, spec_ms_per_token: float, base_fixed_ms: float, base_ms_per_token: float) -> float:
    """T_spec(N) / T_baseline(N) for a session of N generated tokens (linear cost model)."""
    return (spec_fixed_ms + n * spec_ms_per_token) / (base_fixed_ms + n * base_ms_per_token)


def median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ecdf(values) -> tuple:
    """(sorted values, cumulative fractions i/n)."""
    xs = sorted(v for v in values if v is not None)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def pareto_front(points) -> list:
    """Indices of the points (x, y) not dominated when both are to be minimised, sorted by x."""
    idx = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 <= y) and (x2 < x or y2 < y) for j, (x2, y2) in enumerate(points) if j != i):
            idx.append(i)
    return sorted(idx, key=lambda i: points[i])


def homogeneity_p_value(a: list, b: list, min_expected: float = 5.0) -> float:
    """Chi-square test that two samples of categories come from one distribution; categories with
    a pooled expected count below min_expected are merged into one cell. 1.0 with one cell."""
    from scipy import stats
    na, nb = len(a), len(b)
    counts: dict = {}
    for x in a:
        counts.setdefault(x, [0, 0])[0] += 1
    for x in b:
        counts.setdefault(x, [0, 0])[1] += 1
    table, rare = [], [0, 0]
    for ca, cb in counts.values():
        if min(na, nb) * (ca + cb) / (na + nb) >= min_expected:
            table.append([ca, cb])
        else:
            rare = [rare[0] + ca, rare[1] + cb]
    if sum(rare):
        table.append(rare)
    if len(table) < 2:
        return 1.0
    return float(stats.chi2_contingency(table, correction=False)[1])


def goodness_of_fit_p_value(samples: list, probs: dict, min_expected: float = 5.0) -> float:
    """Chi-square test of samples against known probabilities {category: p}; categories whose
    expected count is below min_expected (and samples outside probs) are pooled into one cell."""
    from scipy import stats
    n = len(samples)
    counts: dict = {}
    for x in samples:
        counts[x] = counts.get(x, 0) + 1
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for cat, p in probs.items():
        if p * n >= min_expected:
            obs.append(counts.pop(cat, 0))
            exp.append(p * n)
        else:
            rest_o += counts.pop(cat, 0)
            rest_e += p * n
    rest_o += sum(counts.values())
    if rest_o > 0 and rest_e == 0:
        return 0.0                      # samples the champion cannot produce
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    if len(obs) < 2:
        return 1.0
    total = sum(exp)
    return float(stats.chisquare(obs, [e * n / total for e in exp]).pvalue)


def acceptance_by_bin(pairs, edges: list) -> list:
    """pairs (x, accepted 0/1) binned by x on edges [e0, e1, ...]: [(lo, hi, n, rate or None)]."""
    out = []
    for lo, hi in zip(edges, edges[1:]):
        vals = [acc for x, acc in pairs if lo <= x < hi]
        out.append((lo, hi, len(vals), sum(vals) / len(vals) if vals else None))
    return out


def entropy_nats(probs) -> float:
    return -sum(p * math.log(p) for p in probs if p > 0)


# ---- evaluation v2: per-token speed-ups, bootstrap intervals, the conditional distribution tests ----
BOOT_RESAMPLES, BOOT_SEED, BOOT_LEVEL = 2000, 20261202, 0.95


def ms_per_token(total_ms, n_tokens):
    """Page ms per generated token (prefill included): the v2 unit; None without tokens."""
    if total_ms is None or not n_tokens:
        return None
    return total_ms / n_tokens


def geo_mean(values):
    """Geometric mean of positive values (None when there are none)."""
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def bootstrap_ci(groups, statistic=geo_mean, resamples: int = BOOT_RESAMPLES, seed: int = BOOT_SEED,
                 level: float = BOOT_LEVEL):
    """Percentile bootstrap of statistic(pooled values): `groups` is a list of lists (strata); each
    resample draws, within every group, as many values as it has, with replacement. A fixed seed
    gives a fixed interval; constant values give a zero-width one. (lo, hi), or None without data."""
    import numpy as np
    groups = [[v for v in g if v is not None] for g in groups]
    groups = [g for g in groups if g]
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=float) for g in groups]
    draws = [rng.integers(0, len(a), size=(resamples, len(a))) for a in arrays]   # per group: resamples x its size
    if statistic is geo_mean and all((a > 0).all() for a in arrays):
        logs = sum(np.log(a)[d].sum(axis=1) for a, d in zip(arrays, draws))
        stats = np.exp(logs / sum(len(a) for a in arrays))
    else:
        stats = [statistic([v for a, d in zip(arrays, draws) for v in a[d[i]].tolist()]) for i in range(resamples)]
    lo, hi = np.quantile(np.asarray(stats, dtype=float), [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def cluster_bootstrap_ci(clusters, resamples: int = BOOT_RESAMPLES, seed: int = BOOT_SEED, level: float = BOOT_LEVEL):
    """Two-stage percentile bootstrap of the geometric mean (gates v3): `clusters` is a list of
    clusters (engine pairs), each a list of groups (strata) of positive values. Each resample draws
    as many clusters as there are, with replacement, then within every drawn cluster's groups as
    many values as each has, with replacement (a cluster drawn twice gets two independent inner
    draws); the statistic is the geometric mean of everything drawn. So the interval carries the
    spread between clusters (two engines loaded side by side differ by a few per cent, and which
    one is faster changes from load to load), which resampling requests alone leaves out. One
    cluster is bootstrap_ci of its groups exactly. (lo, hi), or None without data."""
    import numpy as np
    clusters = [[[v for v in g if v is not None] for g in c] for c in clusters]
    clusters = [[g for g in c if g] for c in clusters]
    clusters = [c for c in clusters if c]
    if not clusters:
        return None
    if len(clusters) == 1:
        return bootstrap_ci(clusters[0], resamples=resamples, seed=seed, level=level)
    n_clusters = len(clusters)
    rng = np.random.default_rng(seed)
    # per cluster and draw slot: the log-sum and count of one inner resample (resamples x slots)
    log_sums, counts = [], []
    for c in clusters:
        arrays = [np.log(np.asarray(g, dtype=float)) for g in c]
        total = np.zeros((resamples, n_clusters))
        for a in arrays:
            total += a[rng.integers(0, len(a), size=(resamples, n_clusters, len(a)))].sum(axis=2)
        log_sums.append(total)
        counts.append(sum(len(a) for a in arrays))
    log_sums, counts = np.stack(log_sums), np.asarray(counts, dtype=float)   # clusters x resamples x slots
    picked = rng.integers(0, n_clusters, size=(resamples, n_clusters))       # resamples x slots: which cluster
    rows, slots = np.arange(resamples)[:, None], np.arange(n_clusters)[None, :]
    stats = np.exp(log_sums[picked, rows, slots].sum(axis=1) / counts[picked].sum(axis=1))
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def conditional_position_samples(a: list, b: list, position: int) -> tuple:
    """The tokens at answer position `position` (1-based) of the samples (lists of ids) of two
    arms, kept only where the first position-1 tokens equal the most common such prefix among
    both arms' samples that reach the position (ties: the smallest prefix). (prefix, a_tokens, b_tokens)."""
    reach = [tuple(s[:position - 1]) for s in a + b if len(s) >= position]
    if not reach:
        return None, [], []
    counts: dict = {}
    for p in reach:
        counts[p] = counts.get(p, 0) + 1
    prefix = min(counts, key=lambda p: (-counts[p], p))
    pick = lambda ss: [s[position - 1] for s in ss if len(s) >= position and tuple(s[:position - 1]) == prefix]
    return list(prefix), pick(a), pick(b)


def bonferroni(p_values: list) -> list:
    """Each p times the number of tests, at most 1."""
    m = len(p_values)
    return [min(1.0, p * m) for p in p_values]


def pooled_log_sd(groups):
    """The pooled within-group standard deviation of log(value): groups of positive values that
    should be equal but for noise (identical requests; one cell's per-request speed-ups). ->
    (sd, degrees of freedom); (None, 0) when no group has two values."""
    ss, dof = 0.0, 0
    for g in groups:
        logs = [math.log(v) for v in g if v is not None and v > 0]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        dof += len(logs) - 1
    return (math.sqrt(ss / dof), dof) if dof else (None, 0)


def requests_to_clear(log_sd: float, threshold: float, true_ratio: float = 1.0, z: float = 1.959964):
    """Requests a cell needs for its 95% interval (normal approximation of the bootstrap of a
    geometric mean) around `true_ratio` to clear `threshold` from above: the smallest n with
    z * log_sd / sqrt(n) < log(true_ratio / threshold). None when true_ratio <= threshold (no n
    does) or log_sd is None."""
    if log_sd is None or true_ratio <= threshold:
        return None
    margin = math.log(true_ratio / threshold)
    return math.floor((z * log_sd / margin) ** 2) + 1
