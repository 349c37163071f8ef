"""The errors the CLI reports as a one-line message, with their exit codes.

``SpeechperfError``: bad input (a file, value or configuration the message names): exit 2.
``RunFailed``: a run that started and could not finish right (it diverged, or the machine
failed it: a full disk, a read-only or vanished folder): exit 1. Its status in the run's
summary, database and event log says the same.
"""
import signal


class SpeechperfError(Exception):
    """A user-facing failure: bad input, bad config, missing file. The message names it."""

    exit_code = 2


class ConfigError(SpeechperfError, ValueError):
    """A preset or override names an unknown field or gives a value of the wrong type, or a
    configuration that cannot run (the field and value named)."""


class RunFailed(SpeechperfError):
    """A run that did not train to its end: diverged, or failed by the machine."""

    exit_code = 1


class Stopped(SpeechperfError):
    """The command was asked to stop (SIGTERM from outside: a scheduler, a shell's kill); it cleaned
    up what it held and exits as a process stopped by that signal does, 128 + its number."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}: what it held is cleaned up (its temporary "
                         "files); run it again")
        self.exit_code = 128 + signum


class MachineFault(RunFailed):
    """The machine failed the run (disk full, read-only or vanished path); the message names
    the path and what to do; the last checkpoint is intact and the same command resumes."""


def in_words(e: BaseException | str, limit: int = 160) -> str:
    """An error's message as a short sentence: its first line and first sentence, cut at a word
    boundary (marked "...") past ``limit`` characters; never a word cut in half.

    Library errors (oneDNN's, CUDA's) run on with advice about environment variables; a row or
    a message needs what happened."""
    text = (str(e).strip().splitlines() or [""])[0].strip() or type(e).__name__
    end = text.find(". ")
    text = text[:end] if end > 0 else text.rstrip(".")
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + "..."
