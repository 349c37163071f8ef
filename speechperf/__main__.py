import os
import sys

from speechperf.cli import main

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
