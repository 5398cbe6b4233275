"""The one exception type for bad user input.

Anything the user can fix (a recipe key, a path, a column, an impossible combination of options) raises
:class:`UserInputError` with a one-line message that names the culprit. It subclasses ``ValueError`` so that
library users can catch it as they would catch TRL's own validation errors; the CLI turns it into one line on
stderr and exit code 2, without a traceback.
"""


class UserInputError(ValueError):
    """Bad user input: the message names the key, path, column or option at fault and how to fix it."""


def one_line(err: BaseException) -> str:
    """An exception of the user's code as one line: its type and the first line of its text."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
