"""Settings every test process and every server it starts share."""

import os

# Servers started by tests keep their KV snapshots in RAM only: no test reads or
# writes the user's ~/.cache, and no snapshot carries from one test's server to
# the next. Tests of the disk tier turn it on with a directory of their own.
os.environ.setdefault("ENGINE_PATCH_NO_DISK_CACHE", "1")
