"""The base of every error that the CLI reports as a one-line message and exit code 2."""


class SpeechperfError(Exception):
    """A user-facing failure: bad input, bad config, missing file. The message names it."""
