import os
import sys


def _without_working_folder() -> None:
    """``python -m speechperf`` puts the working folder first on sys.path, before the standard
    library and the installed packages: run inside a run folder copied from elsewhere, a
    ``json.py`` or ``argparse.py`` left there would run as that module. The folder is taken off
    again before anything else is imported (what ``python -P`` does), unless PYTHONPATH names it
    (the user's own choice). A process forked from the tests' preloaded server has imported all
    it needs already; there, the entry is the server's, taken off only when it is the working folder."""
    if sys.flags.safe_path or not sys.path:
        return
    here = os.getcwd()
    named = {os.path.abspath(p or ".") for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    if sys.path[0] in ("", here) and here not in named:
        del sys.path[0]


_without_working_folder()

from speechperf.cli import main  # noqa: E402  after the path is cleared

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    # A torchrun worker: everything is written and the process group destroyed by now. Skip
    # interpreter finalization, where gloo's C++ threads now and then abort the process
    # (SIGABRT, "terminate called without an active exception"; see parallel/__main__.py),
    # which torchrun would count as a failed worker and restart or fail a finished run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
raise SystemExit(code)
