import os
import sys

from speechperf.parallel.worker import main

code = main()  # the process group is destroyed and every result file closed by now
sys.stdout.flush()
sys.stderr.flush()
# Skip interpreter finalization: gloo's C++ threads can still hold tensors then, and their
# teardown aborts the process now and then (SIGABRT, "terminate called without an active
# exception"; seen here under load, and described in pytorch/pytorch PR 179291), which would
# turn a finished worker into a failed run.
os._exit(code)
