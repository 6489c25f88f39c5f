import sys

from paretoplan.cli import main

sys.exit(main())
