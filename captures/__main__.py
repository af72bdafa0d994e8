import sys

from stable_prefix.captures.cli import main

sys.exit(main())
