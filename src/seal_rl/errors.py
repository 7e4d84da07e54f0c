"""User-facing errors.

Anything a person can fix (a wrong task id, a malformed replay line, a missing file, an unknown
option value) raises :class:`SealError` with a message that says what was wrong and what to do.
The CLI prints that message on one line and exits non-zero; it never shows a traceback for it.
"""


class SealError(Exception):
    """An error caused by input the user can correct; the message says how."""


class SealWarning(UserWarning):
    """Something the user should know that does not stop the work (a torn or corrupt log line
    left out, a setting that makes no sense together with another). The CLI prints it on one line."""
