"""The book (`make book`, sparsekv.suite.book) in a real browser: every page renders, every image loads, every
internal link resolves.

The book is staged from this repository and built by mkdocs into a temporary folder, with one notebook given an
executed copy (00_tour, its committed cells plus one PNG output, labelled a smoke run, so that the test needs no
kernel) and one explorer screenshot (a committed figure standing in for build/browser/'s). The site is served by
http.server on a loopback port and crawled from its home page in headless Chromium: each page must answer 200 and
show a heading, each <img> must have loaded (naturalWidth > 0), and each link into the site must answer 200. The
crawl must reach every page mkdocs wrote. A second test plants a page with a broken image, a broken link and no
heading, and checks that the same crawl reports exactly those three.

Skipped without Chromium and chromedriver (as tests/test_browser.py), or without the `book` extra (mkdocs-material,
mkdocs-jupyter), with the command that installs each.
"""
import base64
import functools
import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from conftest import REPO
from test_browser import _find_browser

from sparsekv.suite import book

# One script per page: its heading, each image's state and every link's resolved address (fragments dropped)
_PAGE_JS = """
const h1 = document.querySelector('.md-content h1');
return {title: document.title,
        heading: h1 ? h1.textContent.trim() : '',
        images: Array.from(document.images).map(i => [i.getAttribute('src').slice(0, 80),
                                                       i.src.startsWith('data:') ? 'data:' : i.src,
                                                       i.complete && i.naturalWidth > 0]),
        links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href.split('#')[0])};
"""


@dataclass
class Crawl:
    """What a crawl saw: the pages visited and the images loaded (paths under the site; 'data:' for inline ones),
    and every problem found."""
    pages: set = field(default_factory=set)
    images: set = field(default_factory=set)
    problems: list = field(default_factory=list)


def crawl(browser, base: str, start: str = "index.html", follow: bool = True) -> Crawl:
    """Open `start` and, with `follow`, every .html page linked from a visited page; check each page, image and
    internal link. `base` is the site's address, ending in '/'."""
    out, todo, checked = Crawl(), [start], {}
    while todo:
        page = todo.pop()
        if page in out.pages:
            continue
        out.pages.add(page)
        if (status := _status(base + page, checked)) != 200:
            out.problems.append(f"{page}: HTTP {status}")
            continue
        browser.get(base + page)
        _wait_images(browser)
        seen = browser.execute_script(_PAGE_JS)
        if not seen["heading"] or not seen["title"]:
            out.problems.append(f"{page}: no heading")
        out.images |= {url.removeprefix(base) for _, url, ok in seen["images"] if ok}
        out.problems += [f"{page}: image {src} did not load" for src, _, ok in seen["images"] if not ok]
        for link in dict.fromkeys(seen["links"]):
            if not link.startswith(base):
                continue                                  # outside the site (the theme's credit): not checked
            if (status := _status(link, checked)) != 200:
                out.problems.append(f"{page}: link {link[len(base):]} answers HTTP {status}")
            elif follow and link.endswith(".html"):
                todo.append(link[len(base):])
    return out


def _status(url: str, cache: dict) -> int:
    if url not in cache:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as r:
                cache[url] = r.status
        except urllib.error.HTTPError as e:
            cache[url] = e.code
    return cache[url]


def _wait_images(browser, timeout: float = 10) -> None:
    """Until every image has finished loading or failing (complete), so naturalWidth is final."""
    end = time.monotonic() + timeout
    while not browser.execute_script("return Array.from(document.images).every(i => i.complete);"):
        if time.monotonic() > end:
            return
        time.sleep(0.1)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The site's files, plus pages held in memory (`planted`, path -> HTML) that are not on disk."""
    planted: dict = {}

    def do_HEAD(self):
        body = self.planted.get(self.path.split("?")[0])
        if body is None:
            return super().do_HEAD()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return body

    def do_GET(self):
        if self.path.split("?")[0] not in self.planted:
            return super().do_GET()
        self.wfile.write(self.do_HEAD())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in book.GENERATOR:
        pytest.importorskip(module, reason=f"the book's generator is not installed: {book.INSTALL}")
    tmp = tmp_path_factory.mktemp("book")
    smoke, shots = tmp / "smoke", tmp / "shots"
    smoke.mkdir(), shots.mkdir()
    nb = json.loads((REPO / "notebooks/00_tour.ipynb").read_text())       # an executed copy, without a kernel
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    png = base64.b64encode((REPO / "figures/00_bytes_vs_blocks.png").read_bytes()).decode()
    code["outputs"] = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": png, "text/plain": "<Figure>"}}]
    nb["metadata"]["papermill"] = {"end_time": "2026-12-05T10:00:00.000000"}
    (smoke / "00_tour.ipynb").write_text(json.dumps(nb))
    (shots / "routing-1-rendered.png").write_bytes((REPO / "figures/02_explorer.png").read_bytes())
    staged = book.stage(REPO, tmp / "stage", runs=(("full", tmp / "full"), ("smoke", smoke)), shots=shots)
    return staged, book.build(staged, tmp / "site")


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_Handler, directory=str(site[1]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = _find_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    # Every host but the loopback resolves to nothing: the book must need nothing from outside
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1000",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"):
        opts.add_argument(arg)
    b = webdriver.Chrome(service=Service(driver_path), options=opts)
    yield b
    b.quit()


def test_every_page_renders_with_its_images_and_links(site, served, browser):
    staged, root = site
    seen = crawl(browser, served)
    assert seen.problems == []
    written = {p.relative_to(root).as_posix() for p in root.rglob("*.html")} - {"404.html"}
    assert seen.pages == written                       # every page mkdocs wrote is reached from the home page
    committed = {p.relative_to(REPO).as_posix() for p in [*REPO.glob("figures/*.png"), *REPO.glob("benchmarks/results/*.png")]}
    assert committed <= seen.images                    # every committed figure is shown (test_docs: each is linked)
    assert "data:" in seen.images                      # and the planted run's output, inline
    assert "images/explorers/routing-1-rendered.png" in seen.images
    # each notebook page says which copy it shows: the planted smoke run, else the committed notebook
    assert staged.course["notebooks/00_tour.ipynb"].kind == "smoke"
    assert staged.course["notebooks/01_dense_vs_sparse_baselines.ipynb"].kind == "source"
    tour = (root / "notebooks/00_tour.html").read_text()
    assert "A smoke run, not the findings" in tour and "2026-12-05 10:00" in tour
    assert "Not executed" in (root / "notebooks/01_dense_vs_sparse_baselines.html").read_text()
    assert "make lab" in (root / "explorers.html").read_text()


def test_a_broken_page_is_reported(site, served, browser):
    """A copy of a real page with a missing image, a link to a missing page and its heading removed: the crawl
    reports exactly those three (so the test above can fail)."""
    page = (site[1] / "docs/models.html").read_text()
    head, sep, rest = page.partition('<h1')
    rest = rest[rest.index("</h1>") + len("</h1>"):]          # the heading removed
    broken = (head + sep.replace("<h1", "") + '<p><img src="../figures/missing.png" alt="missing">'
              '<a href="gone.html">gone</a></p>' + rest)
    _Handler.planted["/docs/broken.html"] = broken.encode()
    try:
        seen = crawl(browser, served, start="docs/broken.html", follow=False)
    finally:
        _Handler.planted.clear()
    assert sorted(seen.problems) == ["docs/broken.html: image ../figures/missing.png did not load",
                                     "docs/broken.html: link docs/gone.html answers HTTP 404",
                                     "docs/broken.html: no heading"]


def test_each_notebook_page_shows_the_best_copy_and_whether_it_is_current(tmp_path):
    """`book.pick`, no generator or browser needed: a full run before a smoke run before the committed notebook."""
    nb = REPO / "notebooks/00_tour.ipynb"
    full, smoke = tmp_path / "full", tmp_path / "smoke"
    runs = (("full", full), ("smoke", smoke))
    assert book.pick(nb, REPO, runs).kind == "source"                 # no run: the committed notebook
    executed = json.loads(nb.read_text())
    executed["cells"].insert(1, {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]}, "outputs": [],
                                 "execution_count": 1, "source": "num_tokens = 150"})
    smoke.mkdir()
    (smoke / nb.name).write_text(json.dumps(executed))
    got = book.pick(nb, REPO, runs)
    assert (got.kind, got.stale) == ("smoke", False)                  # papermill's injected cell is not a change
    executed["cells"][-1]["source"] = "print('an older version')"
    full.mkdir()
    (full / nb.name).write_text(json.dumps(executed))
    got = book.pick(nb, REPO, runs)
    assert (got.kind, got.path.parent, got.stale) == ("full", full, True)   # the full run wins, and it is stale
    assert "has changed since this run" in book._banner(got, nb.stem)


@pytest.mark.parametrize("target, page", [
    ("../CHANGELOG.md", "../CHANGELOG.html"),                 # a notebook's link to a page: the page's address
    ("../../CHANGELOG.md", "../../CHANGELOG.html"),
    ("archive/README.md", "archive/index.html"),              # a folder's README is its index
    ("01_dense_vs_sparse_baselines.ipynb", "01_dense_vs_sparse_baselines.html"),
    ("../figures/00_tour.png", "../figures/00_tour.png"),     # files keep their names
    ("https://example.org/a.md", "https://example.org/a.md"),  # outside the site: untouched
])
def test_notebook_links_point_at_pages(target, page):
    assert book._site_link(target) == page
