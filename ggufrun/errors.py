"""Every exception ggufrun raises on purpose, in one place.

All are ValueErrors except PullError (a download or cache problem, not a bad value) and GenerationInUseError
(a misuse of one model from two places at once). Each message names the field, value or limit that was wrong.
"""


class GGUFError(ValueError):
    """A file is not a valid GGUF file, or holds something ggufrun cannot use.

    The message names the field (and, for malformed files, the byte offset) that was wrong.
    """


class TokenizerError(ValueError):
    """Text cannot be tokenized/detokenized: the file has no vocabulary, an id is out of range, ..."""


class ChatTemplateError(ValueError):
    """A chat template failed to compile or render, broke a sandbox rule, or raised an error itself."""


class ContextOverflowError(ValueError):
    """More tokens than the KV cache holds (n_ctx). Raised before any state changes."""


class PullError(RuntimeError):
    """Fetching a known model failed: pip could not download it, or the file is not the expected one."""


class GrammarError(ValueError):
    """A response_format, grammar, regex, JSON Schema or tool list cannot be used to constrain generation, or a
    token was not allowed by the constraint. The message names the field that was wrong."""
