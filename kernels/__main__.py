"""`python -m kernels` is `python -m kernels.bench` (the package has no other command)."""

import sys

from kernels.bench import main

sys.exit(main())
