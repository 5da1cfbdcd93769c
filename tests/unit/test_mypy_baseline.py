"""tools/mypy_baseline.py: a new mypy error fails the check, and so does a listed one that is
gone until the list is shrunk; line numbers do not matter."""

from __future__ import annotations

from collections import Counter

import pytest

from tools.mypy_baseline import check, key

OLD = "broker/x.py:10: error: Incompatible types in assignment  [assignment]"
MOVED = "broker/x.py:42:7: error: Incompatible types in assignment  [assignment]"
NEW = "broker/y.py:3: error: Missing return statement  [return]"


def test_an_error_is_listed_without_its_line() -> None:
    listed = "broker/x.py: error: Incompatible types in assignment  [assignment]"
    assert key(OLD) == key(MOVED) == listed


def test_listed_errors_pass_wherever_they_moved(capsys: pytest.CaptureFixture[str]) -> None:
    assert check([MOVED], Counter([key(OLD)])) == 0
    assert "no new errors" in capsys.readouterr().out


def test_a_new_error_fails_with_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert check([OLD, NEW], Counter([key(OLD)])) == 1
    assert NEW in capsys.readouterr().out


def test_a_second_copy_of_a_listed_error_is_new() -> None:
    assert check([OLD, MOVED], Counter([key(OLD)])) == 1


def test_a_fixed_error_asks_to_shrink_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert check([], Counter([key(OLD)])) == 1
    out = capsys.readouterr().out
    assert "make mypy-baseline" in out and key(OLD) in out
