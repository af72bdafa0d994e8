import sys

from captures.cli import main

sys.exit(main())
