"""A real browser: Debian's chromium, headless, driven by Playwright (its Python package).

Playwright's own browser download is never used (no ``playwright install``): the browser is the
system's ``/usr/bin/chromium`` (apt package ``chromium``), or ``$FLEETLET_CHROMIUM``. The flags
keep it off the network: no background fetches, component updates, sync or QUIC.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

CHROMIUM_ENV = "FLEETLET_CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class BrowserMissingError(RuntimeError):
    """No chromium binary where it is expected (install the Debian package ``chromium``)."""


def chromium_path() -> Path:
    """The chromium executable. Raises BrowserMissingError naming where it looked."""
    wanted = os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM
    found = shutil.which(wanted)
    if found is None:
        raise BrowserMissingError(
            f"no chromium at {wanted}: apt-get install chromium (or set ${CHROMIUM_ENV})"
        )
    return Path(found)


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless chromium for the duration of the block. Raises BrowserMissingError."""
    executable = chromium_path()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(executable), args=list(CHROMIUM_ARGS), headless=True
        )
        try:
            yield browser
        finally:
            browser.close()
