"""broker."""

import protocol  # noqa: F401  (registers the deferred third-party imports first)
