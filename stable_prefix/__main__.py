import sys

from stable_prefix.cli import main

sys.exit(main())
