"""protocol."""

from protocol import deferred_imports

deferred_imports.install()
