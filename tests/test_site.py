"""The documentation site (mkdocs.yml, docs/, docs/generate.py): it builds with ``mkdocs build --strict`` (a
broken link, a missing page, a missing snippet or a notebook section that is gone fails it), it has a page per
script whose structure and results come from the script and the committed result files, and in headless Chromium
every page loads without a console error, every image loads and the search box finds a script by its name.

The browser is Debian's ``chromium`` (``.ci/run`` installs it), driven by Playwright's Python client pointed at it.
Without it the browser test skips, unless ``SITE_BROWSER_REQUIRED=1`` (set by ``.ci/run``), where it fails.
Screenshots of the landing page and the PPO Atari page are written to ``$SITE_SHOTS`` (default: pytest's
temporary folder) and their paths printed."""

from __future__ import annotations

import ast
import functools
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("SITE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def docs_site():
    """docs/generate.py, imported by path (docs/ is not a package), as mkdocs loads it."""
    if "docs_site_under_test" not in sys.modules:
        spec = importlib.util.spec_from_file_location("docs_site_under_test", ROOT / "docs" / "generate.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["docs_site_under_test"] = module
        spec.loader.exec_module(module)
    return sys.modules["docs_site_under_test"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as CI builds it: ``mkdocs build --strict`` (warnings are errors), into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return out


def pages(site: Path) -> list[str]:
    """Every page's URL path, relative to the site's root ("" is the landing page)."""
    return sorted(
        str(p.parent.relative_to(site)).replace(".", "") + "/" if p.parent != site else "" for p in site.rglob("index.html")
    )


# ------------------------------------------------------------------------------------------- the build


def test_the_site_builds_strictly_with_a_page_per_script_quoting_its_structure_and_results(site):
    scripts = sorted(p.stem for p in (ROOT / "algos").glob("*.py"))
    assert sorted(docs_site().SCRIPTS) == scripts, "every script in algos/ has a page (docs_site.SCRIPTS) and no other"
    for name in scripts:
        html = (site / "algos" / name / "index.html").read_text()
        tree = ast.parse((ROOT / "algos" / f"{name}.py").read_text())
        defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        missing = [d for d in defined if f"<code>{d}</code>" not in html]
        assert not missing, f"algos/{name}.py's page does not name {missing}: its structure is not today's"
        assert re.search(r'<img [^>]*src="\.\./\.\./generated/img/[\w.-]+\.png"', html), f"{name}: no figure"
        assert "95%" in html, f"{name}: no interval in its results"
        for flag in ("--preset", "--sampler"):
            assert f"<code>{flag}</code>" in html, f"{name}: the flags table lacks {flag}"
    for module in sorted(p.stem for p in (ROOT / "shared").glob("*.py") if p.stem != "__init__"):
        html = (site / "api" / module / "index.html").read_text()
        assert 'class="doc doc-' in html, f"shared.{module}: mkdocstrings rendered nothing"
    shown = {p.name for p in (site / "generated" / "img").glob("*.png")}
    committed = {p.name for p in (ROOT / "benchmarks" / "results").glob("*.png")}
    assert committed <= shown, f"committed figures not on the site: {sorted(committed - shown)}"
    for page in (
        "",
        "getting-started/",
        "contract/",
        "gpu/",
        "experiments/",
        "results/",
        "results/atari100k/",
        "results/mujoco/",
        "results/cheap/",
        "results/speed/",
        "results/notebook/",
        "api/",
    ):
        assert (site / page / "index.html").is_file(), page
    print(f"\nsite: {len(pages(site))} pages in {site}")


# --------------------------------------------------------------------------------- the generator, in-process


def test_a_notebook_section_the_site_quotes_must_exist_once(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Measured\n\n## Replay memory (`x`)\n\nrows\n\n## Replay save\n\nmore\n")
    ds = docs_site()
    book = ds.Notebook(readme)
    assert book.find("Replay memory")[1].strip() == "rows"
    with pytest.raises(KeyError, match="0 sections start with 'Sum tree'"):
        book.find("Sum tree")
    with pytest.raises(KeyError, match="2 sections start with 'Replay'"):
        book.find("Replay")


def test_a_script_s_structure_is_read_from_its_source(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text('''"""Toy.

    python toy.py --preset small   # run it

Where to change what: the loss in toy_loss."""
from dataclasses import dataclass


@dataclass
class Args:
    # experiment
    seed: int = 1
    """the seed"""
    # algorithm
    lr: float = 3e-4
    """step | size"""


PRESETS = {
    "big": Args(),
    # From the paper (Someone et al. 2020).
    "small": Args(lr=1e-3),
}

# ---------------------------------------------------------------- loss and update


def toy_loss(x):
    """The loss. More."""
    return x, {"td_loss": x.detach(), "q": x.mean()}


class Net:
    """A network."""

    def forward(self, x):
        return x


# ---------------------------------------------------------------- main


def main():
    stats = {}
    stats["extra"] = 1
    run.periodic(1, learning_rate=2, **stats)
''')
    ds = docs_site()
    s = ds.structure(script)
    assert [(e.section, e.name, e.kind) for e in s["entries"]] == [
        ("flags and presets", "Args", "class"),
        ("loss and update", "toy_loss", "function"),
        ("loss and update", "Net", "class"),
        ("main", "main", "function"),
    ]
    net = s["entries"][2]
    assert net.summary == "A network." and net.members == ["forward"]
    assert s["entries"][1].summary == "The loss."
    assert s["args"] == [("experiment", "seed", "1", "the seed"), ("algorithm", "lr", "3e-4", "step | size")]
    assert s["presets"] == [("big", "", []), ("small", "From the paper (Someone et al. 2020).", ["lr=1e-3"])]
    assert s["stats"] == ["extra", "q", "td_loss"]
    assert s["periodic"] == ["learning_rate", "**stats"]
    md = ds.structure_markdown("toy", s)
    assert "`toy_loss`" in md and "step \\| size" in md and "`lr=1e-3`" in md  # a | in a cell does not split it
    about = ds.about_markdown("toy", s)
    assert "```bash\n> python toy.py --preset small" in about and "the loss in `toy_loss`" in about


def test_generation_rewrites_only_what_changed_and_removes_what_is_gone(tmp_path):
    ds = docs_site()
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "img").mkdir(parents=True)
    (src / "a.md").write_text("a")
    (src / "img" / "b.png").write_bytes(b"b")
    assert ds.sync(src, dst) == 2
    before = (dst / "a.md").stat().st_mtime_ns
    assert ds.sync(src, dst) == 0, "an unchanged file was written again (mkdocs serve would rebuild forever)"
    assert (dst / "a.md").stat().st_mtime_ns == before
    (src / "img" / "b.png").unlink()
    (src / "a.md").write_text("A")
    assert ds.sync(src, dst) == 2
    assert (dst / "a.md").read_text() == "A" and not (dst / "img").exists()


# ------------------------------------------------------------------------------------------- the browser


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on a free local port (search loads its index with fetch, which file:// refuses)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("SITE_BROWSER_REQUIRED") == "1":
            pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:  # launch() gives the browser a fresh profile (user data dir) of its own
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url: str) -> tuple[object, list[str]]:
    """A page at ``url`` once loaded, and the problems seen: console errors, uncaught exceptions, failed requests
    and HTTP errors, images that did not load."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.goto(url, wait_until="load")
    broken = page.evaluate("""() => Array.from(document.images)
        .filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src'))""")
    problems += [f"image not loaded: {src}" for src in broken]
    return page, problems


def sweep(browser, served: str, urls: list[str], shots: Path) -> tuple[dict, int]:
    """Open every page of ``urls``: the problems seen per page and the images counted (screenshots of two pages)."""
    problems, images, times = {}, 0, {}
    for path in urls:
        t = time.perf_counter()
        page, found = open_page(browser, served + path)
        times[path] = time.perf_counter() - t
        images += page.evaluate("document.images.length")
        if found:
            problems[path or "/"] = found
        if path == "":
            page.screenshot(path=str(shots / "landing.png"))
        if path == "algos/ppo_atari/":
            page.screenshot(path=str(shots / "ppo_atari_full.png"), full_page=True)
            page.locator("img[src*='minigrid_doorkey']").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "ppo_atari_curves.png"))
        page.close()
    slowest = sorted(times.items(), key=lambda kv: -kv[1])[:3]
    print(f"\nslowest pages: {', '.join(f'{k or chr(47)} {v:.1f} s' for k, v in slowest)}")
    return problems, images


def api_pages(site: Path) -> tuple[list[str], list[str]]:
    """The API reference's pages: three in the default tier, the rest with the slow tests. They are one mkdocstrings
    template over shared/'s modules, and the strict build (above) already checks them all; CI time is why."""
    api = [u for u in pages(site) if u.startswith("api/")]
    return api[:3], api[3:]


def test_every_page_loads_in_chromium_without_errors_and_search_finds_a_script(site, served, browser, tmp_path):
    shots = Path(os.environ.get("SITE_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    urls = [u for u in pages(site) if not u.startswith("api/")] + api_pages(site)[0]
    assert len(urls) > 20, urls
    problems, images = sweep(browser, served, urls, shots)
    assert not problems, problems
    assert images > 30, f"only {images} images on the site's pages"

    page, found = open_page(browser, served)
    query = page.locator("input.md-search__input")  # in the header at this width
    query.click()
    # Material's search answers key presses once its worker has built the index: fill() sends no key events, and
    # keys typed before the index is ready can be dropped (the search then never runs: a flaky test before).
    page.locator(".md-search-result__meta", has_text="Type to start searching").wait_for(timeout=30_000)
    query.press_sequentially("ppo_atari")
    hit = page.locator(".md-search-result__item a[href*='algos/ppo_atari/']").first
    hit.wait_for(state="visible", timeout=20_000)
    titles = page.locator(".md-search-result__item").all_inner_texts()
    page.close()
    assert not found, found
    assert any("ppo_atari" in t for t in titles), titles
    print(
        f"\nsite: {len(urls)} pages and {images} images checked in Chromium; screenshots: {shots / 'landing.png'}, "
        f"{shots / 'ppo_atari_curves.png'}, {shots / 'ppo_atari_full.png'}"
    )


@pytest.mark.slow
def test_every_other_api_page_loads_in_chromium_without_errors(site, served, browser, tmp_path):
    rest = api_pages(site)[1]
    assert len(rest) > 20, rest
    problems, _ = sweep(browser, served, rest, tmp_path)
    assert not problems, problems
