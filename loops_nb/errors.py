"""Errors that are the user's to fix.

A `UserError` is printed by the CLI as one clear line (never a traceback): it names the file, row or key
at fault and what would be valid. Anything else that escapes is a bug in loops_nb.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix: bad config, bad data, missing credentials, a wrong path."""


class ConfigError(UserError):
    """A config file or override that cannot be used as written."""


class DataError(UserError):
    """A dataset file or row that cannot be used as written."""


class CredentialsError(UserError):
    """A scope or provider that needs credentials the environment does not hold."""
