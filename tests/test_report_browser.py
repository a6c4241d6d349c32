"""The HTML report, rendered by a real browser (headless Chromium, Debian's package).

`make test` installs Chromium first (`make browser`). Without it this test FAILS with
the command to run: a skipped browser test would hide a blank or broken report.

What is checked:
* statically, the file is self-contained: no http(s) or protocol-relative URL in any
  src, href or CSS url(), no external script or style sheet;
* in the browser, with every host name unresolvable and a dead proxy (any request off
  the machine fails) and a NetLog of every request: the page requests nothing but its
  own file and data: URLs;
* from the DOM after load (a copy of the page with a small probe script appended):
  every figure (img, svg) and every table is laid out with a non-zero size, and every
  image decoded;
* from a screenshot: the page is not blank.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import cli
from test_reports_fixture import build_run, build_sweep

BROWSERS = ("chromium", "chromium-browser")
# The line `make browser` prints when Chromium is missing and no one consented to
# installing it (tests/test_fresh_clone.py checks the Makefile says the same).
BROWSER_MISSING = ("headless Chromium is missing (tests/test_report_browser.py needs it): run "
                   "'make browser INSTALL_BROWSER=1' to apt-get install Debian's chromium "
                   "system-wide (as root or with sudo), or install chromium yourself")
# A guard against a hung browser, not a speed assertion.
HANG_GUARD_S = 180
WINDOW = (1280, 2000)

PROBE = """
<script>
window.addEventListener("load", () => {
  const boxes = [];
  for (const el of document.querySelectorAll("img, svg, table")) {
    const r = el.getBoundingClientRect();
    boxes.push({tag: el.tagName.toLowerCase(), id: (el.closest("figure") || {}).id || "",
                w: r.width, h: r.height,
                decoded: el.tagName !== "IMG" || (el.complete && el.naturalWidth > 0)});
  }
  const resources = performance.getEntriesByType("resource").map(e => e.name);
  const pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.textContent = JSON.stringify({boxes, resources, location: String(location.href)});
  document.body.appendChild(pre);
});
</script>
"""

EXTERNAL = [
    re.compile(r"""\b(?:src|href|srcset|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//""", re.I),
    re.compile(r"""url\(\s*["']?\s*(?:https?:)?//""", re.I),
    re.compile(r"""@import""", re.I),
    re.compile(r"""<(?:script|link)\b[^>]*\b(?:src|href)\s*=""", re.I),
]


def _chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"{BROWSER_MISSING}; this test never skips", pytrace=False)


def _run(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-default-apps", "--disable-extensions", "--hide-scrollbars",
           # any request off the machine fails: no name resolves, the proxy is dead
           "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
           f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    runs = [build_run(root / "wt-lru", ratio=2.0),
            build_run(root / "wb-df", write_policy="write_back", host_policy="duplicate_first",
                      ratio=2.0, seed=1)]
    sweep = build_sweep(root / "sweep", ratios=(1.0, 2.0), seeds=(0,), requests=60)
    out = root / "report.html"
    assert cli.main(["report", *map(str, runs), str(sweep), "-o", str(out)]) == 0
    return out


def test_the_report_names_no_external_resource(report):
    html = report.read_text()
    for pattern in EXTERNAL:
        found = pattern.search(html)
        assert found is None, f"external reference: {html[found.start():found.start() + 80]!r}"


def test_the_browser_lays_out_every_figure_and_table_and_requests_nothing(report, tmp_path):
    browser = _chromium()
    html = report.read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    netlog = tmp_path / "netlog.json"
    res = _run(browser, tmp_path / "profile", "--virtual-time-budget=15000",
               f"--log-net-log={netlog}", "--dump-dom", probe.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r'<pre id="layout-probe">(.*?)</pre>', res.stdout, re.S)
    assert m, f"the probe never ran (no load event?): {res.stderr[-1000:]}"
    data = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&")
                      .replace("&lt;", "<").replace("&gt;", ">"))
    boxes = data["boxes"]
    want = {"img": len(re.findall(r"<img\b", html)), "svg": len(re.findall(r"<svg\b", html)),
            "table": len(re.findall(r"<table\b", html))}
    assert want["img"] >= 3 and want["table"] >= 3  # the fixture's runs and sweep
    assert {t: sum(b["tag"] == t for b in boxes) for t in want} == want
    for b in boxes:
        assert b["w"] > 0 and b["h"] > 0, b
        assert b["decoded"], b
    # the page itself loaded nothing but data: URLs (its resource timing) ...
    assert all(u.startswith(("data:", "file:")) for u in data["resources"]), data["resources"]
    # ... and the browser's NetLog shows no request the page started
    assert _page_requests(netlog) == []


def _page_requests(netlog: Path) -> list[str]:
    """URLs of the network requests the page started, from Chromium's NetLog.

    The browser's own background requests (time sync, sign-in probes) are started
    with initiator "not an origin"; anything the page asks for carries its origin
    (a file:// page's is "null"). Local file and data: URLs are not network requests."""
    text = netlog.read_text(errors="replace").rstrip()
    try:
        log = json.loads(text)
    except ValueError:  # a browser that exits before closing the array
        log = json.loads(text.rstrip(",") + "]}")
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    out = []
    for e in log.get("events", []):
        p = e.get("params") or {}
        # (the job's end event carries only its net_error: the proxy refused it)
        if names.get(e.get("type")) == "URL_REQUEST_START_JOB" and "url" in p and \
                p.get("initiator") != "not an origin" and \
                not str(p.get("url", "")).startswith(("file:", "data:")):
            out.append(p["url"])
    return out


def test_the_request_check_catches_an_external_image(tmp_path):
    """The harness is not vacuous: a page with one external image is caught."""
    browser = _chromium()
    page = tmp_path / "leak.html"
    page.write_text('<!DOCTYPE html><html><body><p>x</p>'
                    '<img src="https://example.invalid/pixel.png"></body></html>')
    netlog = tmp_path / "netlog.json"
    res = _run(browser, tmp_path / "profile", "--virtual-time-budget=5000",
               f"--log-net-log={netlog}", "--dump-dom", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    assert _page_requests(netlog) == ["https://example.invalid/pixel.png"]
    assert any(p.search(page.read_text()) for p in EXTERNAL)


def test_the_screenshot_is_not_blank(report, tmp_path):
    import matplotlib.image as mpimg

    browser = _chromium()
    shot = tmp_path / "report.png"
    res = _run(browser, tmp_path / "profile", "--virtual-time-budget=15000",
               f"--screenshot={shot}", report.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    img = mpimg.imread(shot)[..., :3]  # floats in [0, 1]
    assert img.shape[:2] == (WINDOW[1], WINDOW[0])
    ink = (img < 0.85).any(axis=2).mean()  # text, table rules, plot lines
    colours = len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert ink > 0.01, f"only {ink:.2%} of the page is not white"
    assert colours > 50, f"only {colours} colours: the plots did not render"
