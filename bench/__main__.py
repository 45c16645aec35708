"""`python -m bench ...`: the workloads of `chatloom bench` (bench.workloads)."""

import sys

from bench.workloads import main

main(sys.argv[1:])
