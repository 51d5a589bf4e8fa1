"""Exceptions raised by ggufrun."""


class GGUFError(ValueError):
    """A file is not a valid GGUF file, or holds something ggufrun cannot use.

    The message names the field (and, for malformed files, the byte offset) that was wrong.
    """
