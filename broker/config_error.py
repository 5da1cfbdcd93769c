"""The error of a configuration that cannot be served: a leaf, so that any layer may raise it
and the entry point answers it with one line and exit code 2."""


class ConfigError(ValueError):
    pass
