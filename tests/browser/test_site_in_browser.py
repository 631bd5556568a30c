"""The HTML edition (`make site`) in a real browser, offline: the stored sliders are drawn.

Builds the site into a temporary folder with the widget manager's JavaScript next to the pages
(fetched once with ``npm pack`` into ``build/site-vendor/``, see scripts/build_site.py), opens
``index.html`` from ``file://`` in Debian's Chromium (Playwright) with every non-file request
refused, follows the index's link to each notebook that has widgets, and checks that every
slider stored in the notebook is drawn as a slider (its description, and the stored value for
integer sliders), not as text. Formulas need MathJax from a CDN: those requests are the only
ones refused. A screenshot per page goes to ``build/browser-screenshots/site-*.png``.

Without /usr/bin/chromium the test skips (fails under GRADACCUM_REQUIRE_BROWSER=1, as in CI).
Without npm, or when the npm registry cannot be reached and nothing is cached, it skips: the
pages would then load the widget JavaScript from a CDN, which a test must not depend on.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "browser-screenshots"
SLIDERS = {"IntSliderModel", "FloatSliderModel", "SelectionSliderModel"}
WIDGET_S = 60

spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
build_site = importlib.util.module_from_spec(spec)
sys.modules["build_site"] = build_site  # dataclasses look their module up by name
spec.loader.exec_module(build_site)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    try:
        vendor = build_site.fetch_widget_files()
    except (RuntimeError, OSError) as error:
        pytest.skip(f"the widget JavaScript could not be fetched ({error}); the site would "
                    "load it from a CDN, which this offline test does not reach")
    out = tmp_path_factory.mktemp("site")
    build_site.build(out, widgets=str(vendor))
    return out


def _stored_sliders(site: Path) -> dict[str, list[dict]]:
    """{page: the stored slider models' states} for each page whose notebook has widgets."""
    pages = json.loads((site / "pages.json").read_text())
    sliders = {}
    for entry in pages:
        if not entry["widgets"]:
            continue
        notebook = json.loads((ROOT / "notebooks" / entry["notebook"]).read_text())
        state = notebook["metadata"]["widgets"][build_site.WIDGET_STATE]["state"]
        sliders[entry["page"]] = [model["state"] for model in state.values()
                                  if model["model_name"] in SLIDERS]
    return sliders


def test_the_index_links_to_pages_whose_sliders_render_offline(browser, site):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    stored = _stored_sliders(site)
    assert stored, "no notebook with widgets: nothing to check"
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    refused = []

    def offline(route) -> None:  # noqa: ANN001 - playwright's Route
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    page.set_default_timeout(WIDGET_S * 1000)
    try:
        for target, sliders in stored.items():
            page.goto((site / "index.html").as_uri())
            page.locator(f"a[href='{target}']").first.click()
            page.wait_for_url(f"**/{target}")
            drawn = page.locator(".widget-slider")
            try:
                drawn.first.wait_for(state="visible")
            except PlaywrightTimeout as error:
                raise AssertionError(f"{target}: no widget drawn within {WIDGET_S} s") from error
            labels = drawn.locator(".widget-label").all_inner_texts()
            assert drawn.count() == len(sliders), (target, labels)
            for slider in sliders:
                assert slider["description"] in labels, (target, slider["description"], labels)
                if isinstance(slider.get("value"), int):
                    one = drawn.filter(has=page.locator(".widget-label",
                                                        has_text=slider["description"]))
                    readout = one.locator(".widget-readout").first.inner_text().strip()
                    assert readout == str(slider["value"]), (target, slider, readout)
            text = page.locator("body").inner_text()
            assert "VBox(children" not in text and "IntSlider(" not in text, target
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            drawn.first.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / f"site-{target.removesuffix('.html')}.png"))
    finally:
        page.close()
    # the widgets came from the files next to the pages: only MathJax was asked of a CDN
    assert all("mathjax" in url.lower() for url in refused), refused
