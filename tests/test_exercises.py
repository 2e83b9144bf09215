"""The notebooks' checking cells: right answers pass in every correct form, wrong and missing ones say
"not yet" without giving the answer away (a hint only after a wrong answer, the answer after three)."""
from __future__ import annotations

import enum

import numpy as np

from renaissance_nb import StreamKind
from renaissance_nb.errors import PhaseError
from renaissance_nb.exercises import REVEAL_AFTER, asked, check, forms, same


def test_numbers_within_tolerance_and_in_any_written_form() -> None:
    assert same(103, 100, rel=0.05) and not same(106, 100, rel=0.05)
    assert same("4,096", 4096) and same("4096.0", 4096) and same(np.int64(7), 7) and same(7.0, 7)
    assert not same(True, 1) and not same("x", 1.0) and not same(float("nan"), 1.0, abs=10)


def test_names_enums_classes_sequences_and_sets() -> None:
    assert same(" Activations ", "activations") and same("train_last", "TRAIN-LAST") and not same("val", "train")
    assert same(StreamKind.UPDATE, StreamKind.UPDATE) and same("StreamKind.UPDATE", StreamKind.UPDATE)
    assert same("update", StreamKind.UPDATE) and not same(StreamKind.COMP_1, StreamKind.UPDATE)
    assert same(PhaseError, PhaseError) and same("PhaseError", PhaseError) and not same(ValueError, PhaseError)
    assert same([1, 4], (1, 4)) and not same((4, 1), (1, 4)) and not same((1, 4, 0), (1, 4))
    assert same(("b", "A"), {"a", "b"}) and same(["OPTIMIZER"], {"OPTIMIZER"}) and not same({"a"}, {"a", "b"})
    assert same("yes", True) and same(np.bool_(False), False) and not same(1, True) and not same("no", True)


def test_every_listed_form_is_accepted() -> None:
    class Colour(enum.Enum):
        RED = 1
    for want in (4096, 2.5, "weights", StreamKind.COMP_2, Colour.RED, PhaseError, (64, 16), {"A", "B"}, True, False):
        assert all(same(form, want) for form in forms(want)), want


def test_missing_answers_say_not_yet_with_neither_hint_nor_answer(capsys) -> None:  # type: ignore[no-untyped-def]
    assert not check("m", None, 31337, hint="look above") and not check("m", ..., 31337)
    out = capsys.readouterr().out
    assert out.count("not yet") == 2 and "31337" not in out and "look above" not in out
    assert asked["m"].want == 31337


def test_wrong_answers_get_the_hint_and_after_three_tries_the_answer(capsys) -> None:  # type: ignore[no-untyped-def]
    for _ in range(REVEAL_AFTER - 1):
        assert not check("w", 5, 31337, hint="count the rows")
    first = capsys.readouterr().out
    assert "not yet: you said 5" in first and "count the rows" in first and "31337" not in first
    assert not check("w", 6, 31337, hint="count the rows")
    assert "31337" in capsys.readouterr().out
    assert check("w", "31,337", 31337) and "right" in capsys.readouterr().out


def test_accept_decides_for_exercises_with_several_right_answers(capsys) -> None:  # type: ignore[no-untyped-def]
    assert check("any even", 4, 2, accept=lambda g: g % 2 == 0) and not check("any even", 3, 2, accept=lambda g: g % 2 == 0)
    assert capsys.readouterr().out.splitlines()[0].startswith("✓ any even: right")


def test_a_set_is_no_ordered_pair_and_a_0d_array_no_sequence() -> None:
    """{4, 1} passed for the pair (1, 4) (a set compared in its own iteration order; a mixed set's order even
    changes with string hashing); np.array(5) against a pair raised a raw TypeError."""
    import numpy as np

    from renaissance_nb.exercises import same
    assert not same({4, 1}, (1, 4)) and not same({10, 1}, (1, 10)) and not same({2, "up"}, (2, "up"))
    assert same((1, 4), (1, 4)) and same([1, 4], (1, 4)) and same(np.array([1, 4]), (1, 4))
    assert same([4, 1], {1, 4}) and same({4, 1}, {1, 4})  # a set answers a set, in any order
    assert not same(np.array(5), (1, 4))
