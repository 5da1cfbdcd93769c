"""StartupError: the broker could not start for a reason its operator can fix.

Raised while starting (a port in use, a log dir that is not a writable directory or that
another broker holds) with one line that names what failed and what to do; the entry point
prints that line and exits with 2, as for a configuration error, instead of a traceback.
A leaf module, so whoever finds such a failure can raise it without importing the server.
"""

from __future__ import annotations


class StartupError(Exception):
    """One line for the operator: what failed, and what to do about it."""
