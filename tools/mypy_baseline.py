"""mypy against a baseline that may only shrink: the errors mypy reported when type checking
began are listed in mypy-baseline.txt, and `make check` fails on any error not in that list.

    python tools/mypy_baseline.py            # check: exit 1 on a new error, or on a listed
                                             # error that is gone (the list must shrink with it)
    python tools/mypy_baseline.py --write    # rewrite the list from what mypy reports now

An error is listed as ``path: error: message  [code]``, without its line number, so editing a
file above an old error does not make it new; the same error twice in a file is listed twice.
mypy's own settings are pyproject.toml's [tool.mypy].
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "mypy-baseline.txt"
HEADER = ("# mypy's errors when type checking began; the list may only shrink.\n"
          "# Regenerate with `make mypy-baseline` (python tools/mypy_baseline.py --write).\n")
ERROR = re.compile(r"^(?P<path>[^:\s][^:]*):(?P<line>\d+)(?::\d+)?: error: (?P<rest>.*)$")


def run_mypy() -> list[str]:
    """mypy's error lines (``path:line: error: ...``); exits if mypy itself failed."""
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True)
    lines = proc.stdout.splitlines()
    # 0: no errors, 1: errors found; anything else (2) is mypy failing to run.
    if proc.returncode not in (0, 1) or not any(
            ln.startswith(("Found ", "Success: ")) for ln in lines):
        sys.stderr.write(proc.stdout + proc.stderr)
        sys.exit(f"mypy did not finish (exit {proc.returncode})")
    return [ln for ln in lines if ERROR.match(ln)]


def key(line: str) -> str:
    """An error without its line (and column) number."""
    m = ERROR.match(line)
    assert m is not None, line
    return f"{m['path']}: error: {m['rest']}"


def read_baseline() -> Counter[str]:
    if not BASELINE.exists():
        return Counter()
    return Counter(ln for ln in BASELINE.read_text().splitlines()
                   if ln.strip() and not ln.startswith("#"))


def write_baseline(errors: list[str]) -> None:
    BASELINE.write_text(HEADER + "".join(f"{k}\n" for k in sorted(map(key, errors))))


def check(errors: list[str], baseline: Counter[str]) -> int:
    current = Counter(map(key, errors))
    new = current - baseline
    gone = baseline - current
    if new:
        # Name the new errors with their line numbers; of an error listed n times, the lines
        # past the n-th are the new ones only by count, so all its lines are shown.
        print(f"mypy: {sum(new.values())} error(s) not in {BASELINE.name}:")
        for line in errors:
            if key(line) in new:
                print(f"  {line}")
    if gone:
        print(f"mypy: {sum(gone.values())} error(s) of {BASELINE.name} are fixed; shrink the "
              "list with `make mypy-baseline` and commit it:")
        for k in sorted(gone.elements()):
            print(f"  {k}")
    if new or gone:
        return 1
    print(f"mypy: no new errors ({sum(current.values())} listed in {BASELINE.name})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite {BASELINE.name} from mypy's errors now")
    args = parser.parse_args(argv)
    errors = run_mypy()
    if args.write:
        before = read_baseline()
        write_baseline(errors)
        after = read_baseline()
        print(f"{BASELINE.name}: {sum(after.values())} errors ({sum((after - before).values())}"
              f" added, {sum((before - after).values())} removed)")
        return 0
    return check(errors, read_baseline())


if __name__ == "__main__":
    sys.exit(main())
