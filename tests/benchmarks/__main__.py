import sys

from tests.benchmarks.harness import main

sys.exit(main(sys.argv[1:]))
