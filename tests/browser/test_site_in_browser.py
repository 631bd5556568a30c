"""The HTML edition (`make site`) in a real browser, offline: sliders drawn, formulas typeset,
solution and source pages reached by their links.

Builds the site into a temporary folder with the widget manager's JavaScript and MathJax next to
the pages (fetched once with ``npm pack`` into ``build/site-vendor/``, see
scripts/site_vendor.py), opens ``index.html`` from ``file://`` in Debian's Chromium (Playwright)
with every non-file request refused, and checks, following the pages' own links:

* every slider stored in a notebook with widgets is drawn as a slider (its description, and
  the stored value for integer sliders), not as text;
* formulas are typeset by the local MathJax (an ``mjx-container`` where the TeX was): in the
  index's row for 01, and in 02's heading "4. Explore: $k$ ..." and its entry in the contents;
* a notebook's link to its solutions opens the solution page (its title), whose link leads back;
* a link to a source file opens the copy of its text in the site;
* the index links the README and the documentation pages (docs/*.md rendered): a table and a
  fenced code block are drawn as such, and their links lead to other pages and to notebooks;

and that no request left the machine and no file the pages asked for was missing. Every link
of the built site (with the real vendored files) is also checked (tests/site_links.py). A
screenshot per page goes to ``build/browser-screenshots/site-*.png``.

Without /usr/bin/chromium the test skips (fails under GRADACCUM_REQUIRE_BROWSER=1, as in CI).
Without npm, or when the npm registry cannot be reached and nothing is cached, it skips: the
pages would then load the JavaScript from a CDN, which a test must not depend on.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urljoin

import pytest
from script_loader import load_script
from site_links import broken_links

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "browser-screenshots"
SLIDERS = {"IntSliderModel", "FloatSliderModel", "SelectionSliderModel"}
WIDGET_S = 60

build_site = load_script("scripts/build_site.py")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    try:
        vendor = build_site.fetch_widget_files()
        mathjax = build_site.fetch_mathjax()
    except (RuntimeError, OSError) as error:
        pytest.skip(f"the widget JavaScript or MathJax could not be fetched ({error}); the "
                    "site would load it from a CDN, which this offline test does not reach")
    out = tmp_path_factory.mktemp("site")
    build_site.build(out, widgets=str(vendor), mathjax=str(mathjax))
    return out


class Offline:
    """A page that reaches nothing but ``file://``: what it asked elsewhere, and the local
    files it asked for that failed to load."""

    def __init__(self, browser) -> None:  # noqa: ANN001 - playwright's Browser
        self.page = browser.new_page(viewport={"width": 1300, "height": 900})
        self.refused: list[str] = []
        self.failed: list[str] = []
        self.page.route("**/*", self._route)
        self.page.on("requestfailed", lambda request: self.failed.append(
            f"{request.url} ({request.failure})") if request.url.startswith("file://")
            else None)
        self.page.set_default_timeout(WIDGET_S * 1000)

    def _route(self, route) -> None:  # noqa: ANN001 - playwright's Route
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.refused.append(route.request.url)
            route.abort()

    def follow(self, href: str) -> None:
        """Click the page's first link to ``href`` and wait for the page it opens."""
        target = urljoin(self.page.url, href)
        self.page.locator(f"a[href='{href}']").first.click()
        self.page.wait_for_url(target)

    def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"site-{name}.png"))

    def close(self) -> None:
        self.page.close()
        # everything came from the files next to the pages, and all of them were there
        assert self.refused == [], self.refused
        assert self.failed == [], self.failed


@pytest.fixture
def offline(browser):
    view = Offline(browser)
    yield view
    view.close()


def _pages(site: Path) -> list[dict]:
    return json.loads((site / "pages.json").read_text())


def _stored_sliders(site: Path) -> dict[str, list[dict]]:
    """{page: the stored slider models' states} for each page whose notebook has widgets."""
    sliders = {}
    for entry in _pages(site):
        if not entry["widgets"]:
            continue
        notebook = json.loads((ROOT / "notebooks" / entry["notebook"]).read_text())
        state = notebook["metadata"]["widgets"][build_site.WIDGET_STATE]["state"]
        sliders[entry["page"]] = [model["state"] for model in state.values()
                                  if model["model_name"] in SLIDERS]
    return sliders


def test_the_index_links_to_pages_whose_sliders_render_offline(offline, site):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    stored = _stored_sliders(site)
    assert stored, "no notebook with widgets: nothing to check"
    page = offline.page
    for target, sliders in stored.items():
        page.goto((site / "index.html").as_uri())
        offline.follow(target)
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
        drawn.first.scroll_into_view_if_needed()
        offline.screenshot(target.removesuffix(".html"))


def _typeset(scope, what: str) -> None:  # noqa: ANN001 - playwright's Locator
    """``scope`` holds a formula that MathJax typeset, and no TeX left as text."""
    formula = scope.locator("mjx-container").first
    try:
        formula.wait_for(state="attached")
    except Exception as error:  # playwright's TimeoutError
        raise AssertionError(f"{what}: no formula typeset: {scope.inner_text()!r}") from error
    assert "$" not in scope.inner_text(), (what, scope.inner_text())


def test_formulas_are_typeset_offline_on_the_index_and_the_pages(offline, site):
    page = offline.page
    page.goto((site / "index.html").as_uri())
    _typeset(page.locator("#notebooks tr", has=page.locator("a[href='01_the_math.html']")),
             "the index's row for 01")
    offline.follow("02_single_device.html")
    _typeset(page.locator("h2", has_text="4. Explore:"), "02's heading 4. Explore: $k$")
    _typeset(page.locator("nav.gradaccum-toc li", has_text="4. Explore:"),
             "02's contents, 4. Explore: $k$")
    offline.screenshot("02_single_device-top")


def test_a_notebook_links_its_solutions_and_its_source_files(offline, site):
    page = offline.page
    pages = {entry["page"]: entry for entry in _pages(site)}
    page.goto((site / "index.html").as_uri())
    offline.follow("02_single_device.html")
    solutions = pages["02_single_device.html"]["solutions"]
    assert solutions == "solutions/02_single_device_solutions.html"
    offline.follow(solutions)
    assert page.title() == pages[solutions]["title"]
    assert page.locator("h1").first.inner_text().startswith(pages[solutions]["title"])
    offline.screenshot("solutions-02")
    offline.follow("../02_single_device.html#Exercises")
    assert page.title() == pages["02_single_device.html"]["title"]

    page.goto((site / "05_ddp_torchrun.html").as_uri())
    offline.follow("source/gradaccum_course/programs/memory_probe.py.html")
    first_line = (ROOT / "gradaccum_course" / "programs" / "memory_probe.py").read_text(
        ).splitlines()[0]
    assert page.locator("pre#source").inner_text().startswith(first_line)
    offline.follow("../../../index.html")  # source/gradaccum_course/programs/ -> the index


def test_the_readme_and_the_docs_pages_open_and_lead_to_the_notebooks(offline, site):
    page = offline.page
    page.goto((site / "index.html").as_uri())
    offline.follow("readme.html")
    assert page.locator("table").count() == 2  # the notebook map and the article's claims
    _typeset(page.locator("tr", has=page.locator("a[href='01_the_math.html']")).first,
             "the README's notebook map, row 01")
    offline.follow("docs/training.html")
    assert page.locator("h1").first.inner_text().startswith("Training the case study")
    command = page.locator("div.highlight pre").first.inner_text()
    assert "recipes.emr_classification.train" in command
    offline.screenshot("docs-training")
    offline.follow("security.html")  # docs -> docs
    assert page.locator("h1").first.inner_text().startswith("Security note")
    page.goto((site / "docs" / "commands.html").as_uri())
    assert page.locator("table th").first.inner_text() == "command"
    page.goto((site / "docs" / "training.html").as_uri())
    offline.follow("../04_emr_case_study.html")  # docs -> notebook
    assert page.title() == {entry["page"]: entry for entry in _pages(site)}[
        "04_emr_case_study.html"]["title"]


def test_every_link_of_the_site_with_its_vendored_files_resolves(site):
    assert broken_links(site) == []
