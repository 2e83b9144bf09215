"""The notebooks' checking cells: right answers pass, wrong and missing ones say so."""
from __future__ import annotations

from renaissance_nb.exercises import check


def test_numbers_within_tolerance_sets_in_any_order_and_missing_answers(capsys) -> None:  # type: ignore[no-untyped-def]
    assert check("n", 103, 100, rel=0.05) and not check("n", 106, 100, rel=0.05)
    assert check("s", ("b", "a"), {"a", "b"}) and not check("s", {"a"}, {"a", "b"})
    assert check("cls", KeyError, KeyError) and not check("cls", ValueError, KeyError)
    assert not check("m", None, 3, hint="look above") and not check("m", ..., 3)
    assert not check("f", float("nan"), 1.0, abs=10) and not check("f", "x", 1.0)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("✓ n: right") and out[1].startswith("✗ n: not yet: you said 106")
    assert "no answer yet" in out[-4] and out[-4].endswith("look above")
