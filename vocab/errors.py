"""The one user-error type.

`ElmoError` means the user gave us something we cannot use (a missing file, a bad line, an unknown config key).
Its message is one line that says what is wrong, where, and how to fix it; the CLI prints it as
``error: <message>`` and exits with code 1. Any other exception is a bug and keeps its traceback.
"""


class ElmoError(Exception):
    """A user-facing error: one line naming what, where (file and line when known) and how to fix it."""
