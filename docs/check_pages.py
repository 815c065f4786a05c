"""Check the built site in a real browser: python docs/check_pages.py docs/_build/html

Every page is opened in headless Chromium (Debian's chromium and chromium-driver, through
Selenium). The check fails on any console error (a script error, or a file that failed to load),
on images that did not load, on links to pages or anchors that do not exist in the build, on
any file a page loaded from outside the build, and on math that MathJax (served from the build's
_static) did not typeset: a formula left as TeX source, or one MathJax marks as an error.
External links are listed, not fetched: the build and its check run offline. A screenshot of
the front page is saved next to the build, as screenshot-index.png.
"""

from __future__ import annotations

import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

SKIP_PAGES = {"search.html"}  # searches only when asked; genindex and the rest are checked


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for key in ("id", "name"):
            if found.get(key):
                self.ids.add(str(found[key]))
        for key in ("href", "src"):
            value = found.get(key)
            if value and not (tag == "a" and key == "src"):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def broken_links(site: Path) -> tuple[list[str], set[str]]:
    """Links to missing files or anchors in the build, and the external addresses seen."""
    pages = {path: _parse(path) for path in site.rglob("*.html")}
    problems, external = [], set()
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme in ("http", "https", "mailto"):
                external.add(link)
                continue
            if parts.scheme or link.startswith("data:"):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{path.relative_to(site)}: {link} -> no such file")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{path.relative_to(site)}: {link} -> no such anchor")
    return problems, external


def _browser() -> object:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1000")
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(options=options, service=service)


_BROKEN_IMAGES = """
return Array.from(document.images)
    .filter(img => !(img.complete && img.naturalWidth > 0))
    .map(img => img.getAttribute('src'));
"""


# Resolves once MathJax has typeset the page (pages without math have no MathJax).
_TYPESET = """
const done = arguments[arguments.length - 1];
if (!window.MathJax || !MathJax.startup) { done(null); return; }
MathJax.startup.promise.then(() => done(null), (error) => done(String(error)));
"""

_MATH = r"""
const formulas = Array.from(document.querySelectorAll('.math'));
const text = document.body.innerText;
return {
    formulas: formulas.length,
    untypeset: formulas.filter(f => !f.querySelector('mjx-container')).map(f => f.textContent.slice(0, 60)),
    errors: Array.from(document.querySelectorAll('mjx-merror')).map(e => e.getAttribute('data-mjx-error') || e.textContent),
    raw: ['$$', '\\(', '\\[', '\\begin{'].filter(s => text.includes(s)),
    outside: performance.getEntriesByType('resource').map(r => r.name).filter(n => !n.startsWith('file:')),
};
"""


def browser_problems(site: Path) -> list[str]:
    """Console errors, images that did not load, files fetched from outside the build and math
    left untypeset, page by page, in headless Chromium."""
    driver: object = _browser()
    driver.set_script_timeout(30)  # type: ignore[attr-defined]
    problems = []
    typeset = 0
    try:
        for path in sorted(site.rglob("*.html")):
            name = str(path.relative_to(site))
            if name in SKIP_PAGES or name.startswith("_"):
                continue
            driver.get(path.resolve().as_uri())  # type: ignore[attr-defined]
            for entry in driver.get_log("browser"):  # type: ignore[attr-defined]
                if entry["level"] == "SEVERE":
                    problems.append(f"{name}: console: {entry['message']}")
            for src in driver.execute_script(_BROKEN_IMAGES):  # type: ignore[attr-defined]
                problems.append(f"{name}: image did not load: {src}")
            failed = driver.execute_async_script(_TYPESET)  # type: ignore[attr-defined]
            if failed:
                problems.append(f"{name}: MathJax failed: {failed}")
            math = driver.execute_script(_MATH)  # type: ignore[attr-defined]
            typeset += math["formulas"]
            problems += [f"{name}: formula not typeset: {tex!r}" for tex in math["untypeset"]]
            problems += [f"{name}: MathJax error: {error}" for error in math["errors"]]
            problems += [f"{name}: TeX left in the text: {raw!r}" for raw in math["raw"]]
            problems += [f"{name}: loaded from outside the build: {url}" for url in math["outside"]]
        driver.get((site / "index.html").resolve().as_uri())  # type: ignore[attr-defined]
        driver.save_screenshot(str(site.parent / "screenshot-index.png"))  # type: ignore[attr-defined]
    finally:
        driver.quit()  # type: ignore[attr-defined]
    if not typeset:
        problems.append("no page has a typeset formula: the math pages did not render")
    print(f"{typeset} formulas typeset by MathJax")
    return problems


def main(argv: list[str]) -> int:
    site = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    if not (site / "index.html").exists():
        print(f"no built site at {site} (run sphinx-build first)")
        return 2
    links, external = broken_links(site)
    pages = browser_problems(site)
    print(f"checked {len(list(site.rglob('*.html')))} pages; {len(external)} external links not fetched")
    for problem in links + pages:
        print("  " + problem)
    print(f"screenshot: {site.parent / 'screenshot-index.png'}")
    return 1 if links or pages else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
