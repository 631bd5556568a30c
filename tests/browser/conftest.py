"""The browser tests' shared Chromium (Debian's /usr/bin/chromium, driven by Playwright)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# headless as root, and without the background connections this closed network refuses
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def browser():
    """A Chromium instance per test module; a missing browser skips, or fails under
    GRADACCUM_REQUIRE_BROWSER=1 (as in CI)."""
    if not CHROMIUM.exists():
        message = ("Chromium not found at /usr/bin/chromium: install it with "
                   "`apt-get install chromium` (Debian) to run the browser tests")
        if os.environ.get("GRADACCUM_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield instance
        instance.close()
