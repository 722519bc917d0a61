"""`python -m exactspec ...`: the same command line as the `exactspec` script."""
import sys

from .host.cli import main

sys.exit(main())
