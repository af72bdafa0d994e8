"""The wheel built from this checkout, for the packaging and proxy-only install tests (built once per module that asks)."""

from tests.support.wheel import wheel  # noqa: F401 (the fixture)
