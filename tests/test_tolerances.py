"""The tolerance table keeps its own rules: one kind of bound per entry, at most ~20x what was
measured, never below it, and every entry used by some test."""
from pathlib import Path

import pytest

from tolerances import TOLERANCES

MAX_HEADROOM = 20          # a tolerance may exceed its measured error by at most this factor


@pytest.mark.parametrize("name", sorted(TOLERANCES))
def test_tolerance_is_measured_and_tight(name):
    tol = TOLERANCES[name]
    assert tol.max_abs == 0 or tol.max_rel == 0, f"{name}: either absolute or relative, not both"
    bound = tol.max_abs or tol.max_rel
    if bound == 0:
        assert tol.measured == 0, f"{name}: a bitwise entry measured an error"
        return
    assert tol.measured <= bound <= MAX_HEADROOM * tol.measured, f"{name}: {tol}"


def test_every_tolerance_is_used():
    tests = Path(__file__).parent
    text = "".join(p.read_text() for p in tests.glob("test_*.py") if p.name != "test_tolerances.py")
    unused = [name for name in TOLERANCES if f'"{name}"' not in text and f"'{name}'" not in text]
    assert not unused, f"entries no test uses: {unused}"
