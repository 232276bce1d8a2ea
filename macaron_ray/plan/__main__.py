"""`python -m macaron_ray.plan`: the same as `macaron plan`."""

import sys

from macaron_ray.plan.report import main

sys.exit(main())
