"""The sliders, tested where readers use them: JupyterLab in a real browser.

Starts JupyterLab on a free loopback port (with a token; --allow-root as root) over a COPY of
the notebooks, opens each notebook that has widgets in Debian's Chromium driven by Playwright,
runs all cells, moves a slider (typing into its readout, or the arrow keys), and checks that
the widget's text and figure change. A screenshot per notebook goes to
``build/browser-screenshots/``. The server and its kernels are stopped afterwards.

Run with ``make test-browser``. Without /usr/bin/chromium the tests skip, unless
GRADACCUM_REQUIRE_BROWSER=1 (as in CI), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = ROOT / "build" / "browser-screenshots"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage"]

# notebook, the slider's description, how to move it (a value to type, or None: click the
# end of its track),
# and whether the widget shows a figure
CASES = [
    ("02_single_device.ipynb", "accumulation steps k", "8", True),
    ("04_emr_case_study.ipynb", "accumulation steps k", "16", True),
    ("05_ddp_torchrun.ipynb", "accumulation steps k", "2", True),
    ("06_beyond.ipynb", "effective batch", None, False),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
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


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lab")
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(notebook, workdir)  # the committed notebooks are never written
    settings = tmp_path_factory.mktemp("lab-settings")
    # every cell stays in the page (no windowing), and no news pop-up
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        '{"windowingMode": "none"}')
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
     ).write_text('{"fetchNews": "false"}')
    port, token = _free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", f"--ServerApp.token={token}",
               f"--ServerApp.root_dir={workdir}", "--ServerApp.open_browser=False",
               f"--LabApp.user_settings_dir={settings}",
               f"--LabApp.workspaces_dir={tmp_path_factory.mktemp('lab-workspaces')}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    env = {**os.environ, "GRADACCUM_PROFILE": "ci", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                os.killpg(server.pid, signal.SIGKILL)
                pytest.fail("JupyterLab did not answer within 120 s")
            time.sleep(0.5)
    yield url, token
    os.killpg(server.pid, signal.SIGTERM)  # the server and every kernel it started
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    time.sleep(1)
    leftovers = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "processes left behind: " + leftovers.stdout


def _menu(page, menu: str, item: str) -> None:  # noqa: ANN001
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def _run_all_cells(page) -> None:  # noqa: ANN001
    # the committed notebook already shows execution counts: clear them first, so that the
    # wait below sees this session's execution, not the stored one
    _menu(page, "Edit", "Clear Outputs of All Cells")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                 .every(p => !/\\d/.test(p.textContent))""", timeout=30_000)
    _menu(page, "Run", "Run All Cells")
    # done when every code cell shows an execution count (none [*] or [ ]), or a cell failed
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            const failed = document.querySelector(
                ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']");
            const done = prompts.length > 0
                && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
            return done || (failed !== null && /Error|Traceback/.test(failed.textContent));
        }""", timeout=300_000)


@pytest.mark.parametrize(("notebook", "description", "typed", "has_figure"), CASES,
                         ids=[case[0] for case in CASES])
def test_moving_a_slider_changes_the_widget(browser, lab, notebook, description, typed,
                                            has_figure):
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        # a workspace of its own: only this notebook open, nothing restored
        page.goto(f"{url}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}"
                  f"?reset&token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        _run_all_cells(page)
        failures = [text for text in page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        ).all_inner_texts() if "Error" in text or "Traceback" in text]
        assert not failures, f"{notebook}: a cell raised: {failures[0][-500:]}"
        slider = page.locator(".widget-slider", has=page.locator(
            ".widget-label", has_text=description)).last
        slider.scroll_into_view_if_needed()
        box = slider.locator("xpath=ancestor::div[contains(@class,'widget-vbox')][1]")
        label = box.locator(".widget-label:not(.widget-slider .widget-label)").last
        before_text = label.inner_text()
        image = box.locator("img").first
        before_image = image.screenshot() if has_figure else b""
        if typed is not None:
            readout = slider.locator(".widget-readout")
            readout.click()
            page.keyboard.press("Control+A")
            page.keyboard.type(typed)
            page.keyboard.press("Enter")
        else:  # a selection slider has no editable readout: click the end of its track
            track = slider.locator(".noUi-base").first
            size = track.bounding_box()
            track.click(position={"x": size["width"] - 2, "y": size["height"] / 2})
        page.wait_for_function("([element, text]) => element.innerText !== text",
                               arg=[label.element_handle(), before_text], timeout=30_000)
        assert label.inner_text() != before_text
        if has_figure:
            page.wait_for_timeout(500)
            assert image.screenshot() != before_image, f"{notebook}: the figure did not change"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        slider.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"{Path(notebook).stem}.png"))
    except Exception:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{Path(notebook).stem}-failure.png"))
        raise
    finally:
        page.close()
