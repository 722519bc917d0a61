"""Exact (Fraction) toy distributions for enumeration tests, including the spec's edge cases."""
from fractions import Fraction as F


def edge_case_rows(vocab_size):
    """Named (p_target, p_draft) pairs over vocab_size tokens covering the spec's edge cases."""
    V = vocab_size
    uniform = [F(1, V)] * V
    peaked = [F(1, 2)] + [F(1, 2 * (V - 1))] * (V - 1)
    half = V // 2
    first = [F(1, half) if i < half else F(0) for i in range(V)]
    second = [F(0) if i < half else F(1, V - half) for i in range(V)]
    tiny = [F(999, 1000)] + [F(1, 1000 * (V - 1))] * (V - 1)
    tiny_rev = [F(1, 1000)] + [F(999, 1000 * (V - 1))] * (V - 1)
    masked = [F(0)] + [F(1, V - 1)] * (V - 1)               # token 0 masked for the champion
    one_hot_last = [F(0)] * (V - 1) + [F(1)]
    cases = {
        "equal": (peaked, peaked),
        "disjoint": (first, second),
        "tiny_overlap": (tiny, tiny_rev),
        "zero_target_prob": (masked, uniform),                # draft may propose token 0; champion says 0
        "zero_draft_prob": (uniform, masked),                 # champion mass where the draft has none
        "masked_vs_peaked": (masked, peaked),
        "deterministic_target": (one_hot_last, uniform),
        "deterministic_draft": (uniform, one_hot_last),
    }
    return cases


def generic_rows(vocab_size, count=4):
    """Full-support rational distributions with distinct shapes: (i + j) mod V weighted."""
    out = []
    for j in range(count):
        w = [1 + ((i * (j + 2) + j) % (vocab_size + 1)) for i in range(vocab_size)]
        out.append([F(x, sum(w)) for x in w])
    return out


def distinct_rows(vocab_size):
    """All distinct rows of the edge cases plus generic full-support ones."""
    rows = []
    for pair in edge_case_rows(vocab_size).values():
        for row in pair:
            if row not in rows:
                rows.append(row)
    return rows + generic_rows(vocab_size)


def table_dist(vocab_size, rows, salt):
    """A context-dependent distribution: picks one of `rows` by a hash of the context."""
    def dist(context):
        h = salt
        for t in context:
            h = (h * 1000003 + t + 1) % 2147483647
        return rows[(h + len(context)) % len(rows)]
    return dist
