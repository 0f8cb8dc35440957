import sys

from benchmarks.kernel_bench.driver import main

sys.exit(main())
