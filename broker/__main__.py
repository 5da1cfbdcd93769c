"""``python -m broker`` and the ``mini-broker`` command: the broker's own process.

Its third-party imports are deferred first (protocol/deferred_imports.py), before anything
imports them; an embedded broker runs in someone else's process and leaves its modules alone,
as it leaves its collector (broker/gc_policy.py).
"""

import sys

from protocol import deferred_imports


def main() -> int:
    deferred_imports.install()
    from broker.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
