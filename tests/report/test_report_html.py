"""report.html: hostile names render as text, long runs stay small, and a real browser shows it as meant.

The browser test renders reports of three recorded GPU runs (starved, healthy, several findings) and opens them in
headless Chromium (Debian's `chromium`), driven by playwright-core from tests/browser/ (`npm install --prefix
tests/browser`, as .ci/run does). It fails, rather than skips, when either is missing: a report nobody looked at
in a browser is not tested. Its screenshots go to docs/screenshots/, which the README shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import REPO, env_with
from gpudoctor.report.model import MAX_POINTS
from gpudoctor.testing import BundleBuilder, fixture_path

PAYLOAD = "<script>alert(1)</script>\"'&"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
IN_PATH = "\"><img src=x onerror=alert(1)>'"  # a file name cannot hold the "/" of </script>
IN_PATH_ESCAPED = "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;&#39;"
BROWSER_DIR = REPO / "tests" / "browser"
SCREENSHOTS = REPO / "docs" / "screenshots"  # rewritten only with GPUDOCTOR_UPDATE_SCREENSHOTS=1
# The tags the template and the SVG renderer write; anything else in a report came from the data.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "header", "footer", "section", "article", "figure", "details",
    "summary", "h2", "h3", "p", "a", "span", "strong", "em", "code", "pre", "br", "ol", "ul", "li", "div", "table",
    "tr", "th", "td", "caption", "svg", "rect", "line", "polyline", "circle", "text",
}
FIXTURES = {  # screenshot name: (recorded bundle, full page?)
    "starved": ("data_starvation_bad", False),
    "several-findings": ("blocking_copy_bad", True),
    "healthy": ("healthy_vision", False),
    "windows": ("data_starvation_late", True),  # profiled with --every: the windows table
}


class _Markup(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag


def _markup(html: str) -> _Markup:
    parser = _Markup()
    parser.feed(html)
    return parser


def _gpudoctor(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "gpudoctor", *args], cwd=cwd, env=env_with(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"gpudoctor {' '.join(args)} exited {done.returncode}\n{done.stderr}"
    return done


# -- a bundle whose every name is hostile ----------------------------------------------------------
EVIL_RULE = '''
from gpudoctor import Finding, rule
from gpudoctor.analysis import Location

PAYLOAD = {payload!r}
SCRIPT = {script!r}


@rule("EVIL101", "evil-names", category="data_starvation", severity="critical")
def evil(run):
    """Doc with <script>alert(1)</script>, `code <b>bold</b>` and "quotes" & ampersands.

    A second paragraph: <img src=x onerror=alert(1)>.

    What it detects: names <b>in bold</b>.

    Why it matters: markup from a run must stay text.

    Fix: escape it.
    """
    yield Finding("Title " + PAYLOAD, impact=0.5, location=Location(SCRIPT, 5, PAYLOAD),
                  evidence={{PAYLOAD: (PAYLOAD, PAYLOAD), "number": 3}}, fix="fix " + PAYLOAD)
'''


def _hostile_report(tmp: Path) -> Path:
    """A bundle (directory, script, arguments, kernel names, exception, a custom rule's finding and docs, the
    source line it points at) full of markup and quotes, analysed by the CLI into tmp/out; returns report.html."""
    source_dir = tmp / f"src{IN_PATH}"
    source_dir.mkdir(parents=True)
    script = source_dir / f"train{IN_PATH}.py"
    script.write_text("".join(f"line_{n} = '{PAYLOAD}'\n" for n in range(1, 10)), encoding="utf-8")
    builder = BundleBuilder(tmp / f"run{IN_PATH}", script=str(script))
    kernel_name = f"void at::native::vectorized_elementwise_kernel<4, {PAYLOAD}>"
    builder.steps(6, wall_s=0.1, data_wait_s=0.02, forward_s=0.02, backward_s=0.03, optimizer_s=0.01,
                  gpu_busy_s=0.04, kernels=12, kernel_name=kernel_name)
    builder.loader(num_workers=0, site=(str(script), 3, PAYLOAD))
    builder.host_samples(other_cores=0.5).gpu_samples(util=40.0)
    builder.exit("exception", 1, exception="ValueError", message=PAYLOAD, where=(str(script), 7, PAYLOAD))
    bundle = builder.write()
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["target"]["args"] = [PAYLOAD, '--name="x"', "--quote='y'"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    rule_file = tmp / "evil_rules.py"
    rule_file.write_text(EVIL_RULE.format(payload=PAYLOAD, script=str(script)), encoding="utf-8")
    out = tmp / "out"
    _gpudoctor("analyze", str(bundle), "--rules", str(rule_file), "--out", str(out), "--format", "json,html")
    return out / "report.html"


@pytest.mark.e2e
def test_hostile_names_render_as_text(tmp_path: Path) -> None:
    report = _hostile_report(tmp_path)
    html = report.read_text(encoding="utf-8")
    markup = _markup(html)
    tags = {tag for tag, _ in markup.tags}
    assert tags <= ALLOWED_TAGS, f"markup from the data: {tags - ALLOWED_TAGS}"
    assert "script" not in tags and not re.search(r"<script", html, re.IGNORECASE)
    for tag, attrs in markup.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        for name in ("href", "src"):
            assert not (attrs.get(name) or "").strip().lower().startswith(("javascript:", "data:")), (tag, attrs)
    hrefs = [attrs["href"] for tag, attrs in markup.tags if tag == "a" and not attrs["href"].startswith("#")]
    assert hrefs and all(h.endswith("/trace.json.gz") and "<" not in h and '"' not in h for h in hrefs), hrefs
    # Each place a name shows, it shows as text.
    shown = {
        "kernel name": f"vectorized_elementwise_kernel&lt;4, {ESCAPED}",
        "script path in the title":
            f"<title>gpudoctor — {tmp_path}/src{IN_PATH_ESCAPED}/train{IN_PATH_ESCAPED}.py</title>",
        "arguments, shell-quoted":
            f"&#39;{ESCAPED}&#34;&#39;&#34;&#39;&#34;&#39;&amp;&#39; &#39;--name=&#34;x&#34;&#39;",
        "finding title": f"<h3>Title {ESCAPED}&#34;&#39;&amp;</h3>",
        "fix": f"fix {ESCAPED}",
        "source line": f"line_5 = &#39;{ESCAPED}",
        "exception message": f"ValueError: {ESCAPED}",
        "rule docs, code spans escaped": "<code>code &lt;b&gt;bold&lt;/b&gt;</code>",
        "rule docs": "&lt;img src=x onerror=alert(1)&gt;",
    }
    for where, text in shown.items():
        assert text in html, f"{where}: {text!r} not in the report"
    assert html.count(ESCAPED) >= 10
    findings = json.loads((report.parent / "findings.json").read_text(encoding="utf-8"))
    evil = next(f for f in findings["findings"] if f["code"] == "EVIL101")
    assert evil["title"] == "Title " + PAYLOAD
    assert evil["evidence"][0] == {"name": PAYLOAD, "value": PAYLOAD, "unit": PAYLOAD}


@pytest.mark.e2e
def test_a_long_run_stays_a_small_page(tmp_path: Path) -> None:
    """An hour of samples and thousands of steps: the timeline is bucketed and the page stays far under a few MB."""
    builder = BundleBuilder(tmp_path / "run", window=(100, 5, 1000))
    builder.steps(3000, wall_s=0.4, data_wait_s=lambda i: 0.3 if i % 7 == 0 else 0.01, forward_s=0.1,
                  backward_s=0.2, optimizer_s=0.02, gpu_busy_s=0.25, kernels=4)
    builder.host_samples(other_cores=1.0, interval_s=0.2).gpu_samples(util=60.0, interval_s=0.2)
    bundle = builder.write()
    _gpudoctor("analyze", str(bundle), "--out", str(tmp_path / "out"), "--format", "html")
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert len(html.encode()) < 1_500_000, f"{len(html.encode()):,} bytes"
    timeline = html[html.index('class="chart timeline-chart"'):]
    timeline = timeline[:timeline.index("</svg>")]
    assert 0 < timeline.count('class="band"') <= MAX_POINTS
    steps_chart = html[html.index('class="chart steps-chart"'):]
    assert steps_chart[:steps_chart.index("</svg>")].count('class="label"') <= 40  # 1000 steps drawn as groups


def test_source_snippet_is_shown_only_when_the_file_is_here(tmp_path: Path) -> None:
    from gpudoctor.report.cards import source_snippet

    source = tmp_path / "train.py"
    source.write_text("".join(f"x{n} = {n}\n" for n in range(1, 21)))
    snippet = source_snippet({"file": str(source), "line": 10, "function": "main"})
    assert snippet is not None and [line["number"] for line in snippet["lines"]] == list(range(7, 14))
    assert [line["text"] for line in snippet["lines"] if line["highlight"]] == ["x10 = 10"]
    assert source_snippet({"file": "train.py", "line": 2, "function": "f"}, run_cwd=str(tmp_path))["line"] == 2
    assert source_snippet({"file": str(tmp_path / "gone.py"), "line": 3, "function": "f"}) is None
    assert source_snippet({"file": str(source), "line": 99, "function": "f"}) is None
    assert source_snippet({"file": str(tmp_path), "line": 1, "function": "f"}) is None  # a directory
    assert source_snippet(None) is None


# -- in a real browser -----------------------------------------------------------------------------
def _browser() -> tuple[str, str]:
    """Chromium and node with playwright-core; a missing one fails the test, saying how to install it."""
    chromium = os.environ.get("GPUDOCTOR_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    node = shutil.which("node")
    missing = []
    if not chromium:
        missing.append("Chromium (apt-get install -y chromium, or set GPUDOCTOR_CHROMIUM)")
    if not node:
        missing.append("Node.js (apt-get install -y nodejs npm)")
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        missing.append("playwright-core (npm install --prefix tests/browser)")
    if missing:
        pytest.fail("the browser test needs " + "; ".join(missing) + ". .ci/run installs them.")
    return chromium, node


def _open_in_browser(pages: list[dict], tmp: Path, chromium: str, node: str) -> list[dict]:
    spec = tmp / "pages.json"
    spec.write_text(json.dumps(pages))
    done = subprocess.run([node, "check_report.mjs", chromium, str(spec)], cwd=BROWSER_DIR, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, f"the browser run failed ({done.returncode}):\n{done.stderr}\n{done.stdout}"
    return json.loads(done.stdout)


@pytest.mark.e2e
def test_reports_in_a_real_browser(tmp_path: Path) -> None:
    chromium, node = _browser()
    shots = SCREENSHOTS if os.environ.get("GPUDOCTOR_UPDATE_SCREENSHOTS") else tmp_path / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    pages = []
    for name, (fixture, full_page) in FIXTURES.items():
        # From the checkout, so that the recorded call sites (fixtures/scripts/...) are found for the snippets.
        _gpudoctor("analyze", str(fixture_path(fixture)), "--out", str(tmp_path / name), "--format", "html")
        pages.append({"html": str(tmp_path / name / "report.html"), "screenshot": str(shots / f"{name}.png"),
                      "full_page": full_page})
    pages.append({"html": str(_hostile_report(tmp_path / "hostile")), "screenshot": None})
    seen = dict(zip([*FIXTURES, "hostile"], _open_in_browser(pages, tmp_path, chromium, node)))

    for name, page in seen.items():
        assert not page["console_errors"] and not page["page_errors"], (name, page)
        assert page["requests"] == [page["url"]], f"{name}: requests other than the file itself: {page['requests']}"
        assert not page["dialogs"] and page["scripts"] == 0, (name, page["dialogs"])
        charts = {c["cls"].split()[-1]: c for c in page["charts"]}
        assert {"steps-chart", "timeline-chart"} <= set(charts), (name, charts)
        for chart in charts.values():
            assert chart["shapes"] > 0 and chart["titles"] > 0 and chart["width"] > 600, (name, chart)
    for name in FIXTURES:
        assert "kernels-chart" in {c["cls"].split()[-1] for c in seen[name]["charts"]}, name
        assert (shots / f"{name}.png").stat().st_size > 10_000

    starved = seen["starved"]
    assert [c["severity"] for c in starved["cards"]][:1] == ["critical"] and starved["cards"][0]["has_source"]
    first_screen = "\n".join(starved["first_screen"])  # what a new user reads before scrolling
    assert "GPU idles" in first_screen and "DataLoader" in first_screen, first_screen
    assert "data_starvation_bad.py:74" in first_screen and "loader = DataLoader(" in first_screen, first_screen
    # The verdict, then the problem's saving as time per step, on the same step as the facts beside it.
    assert "1 problem; fixing it saves ~84% of each 145.0 ms step, down to ~22.8 ms." in first_screen, first_screen
    assert "fix saves ~84%: 145.0 → ~22.8 ms/step (≈6.4×)" in first_screen, first_screen

    several = seen["several-findings"]
    problems = [c for c in several["cards"] if c["severity"] != "info"]
    assert len(problems) >= 2 and all(c["has_source"] and c["has_doc"] and c["has_evidence"] for c in several["cards"])

    windows = seen["windows"]
    assert len(windows["windows"]) == 4, windows["windows"]
    first, *later = windows["windows"]
    # GD102 after the slow shard, nothing before it
    assert first["bars"] == 0 and all(row["bars"] == 1 for row in later)
    assert sum("(charted)" in row["cells"][0] for row in windows["windows"]) == 1

    healthy = seen["healthy"]
    assert not [c for c in healthy["cards"] if c["severity"] != "info"]
    assert any("no problems found" in text for text in healthy["first_screen"]), healthy["first_screen"]


@pytest.mark.e2e
def test_diff_page_in_a_real_browser(tmp_path: Path) -> None:
    """`gpudoctor diff --format html`: a starved run against its fix (docs/screenshots/diff.png), and a run whose
    every name is hostile against itself, every name rendered as text."""
    chromium, node = _browser()
    shots = SCREENSHOTS if os.environ.get("GPUDOCTOR_UPDATE_SCREENSHOTS") else tmp_path / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    page, hostile_page = tmp_path / "diff.html", tmp_path / "hostile-diff.html"
    before, after = (str(fixture_path(name).relative_to(REPO)) for name in ("data_starvation_bad",
                                                                              "data_starvation_fixed"))
    _gpudoctor("diff", before, after, "--format", "html", "--out", str(page))
    hostile_run = _hostile_report(tmp_path / "hostile").parent  # holds findings.json
    _gpudoctor("diff", str(hostile_run), str(hostile_run), "--out", str(hostile_page))

    html = hostile_page.read_text(encoding="utf-8")
    markup = _markup(html)
    assert {tag for tag, _ in markup.tags} <= ALLOWED_TAGS and not re.search(r"<script", html, re.IGNORECASE)
    assert not [attrs for _, attrs in markup.tags if any(a.startswith("on") for a in attrs)]
    for text in (f"<strong>Title {ESCAPED}&#34;&#39;&amp;</strong>", f"fix {ESCAPED}", f"train{IN_PATH_ESCAPED}.py:5"):
        assert text in html, text

    seen = _open_in_browser([{"html": str(page), "screenshot": str(shots / "diff.png"), "full_page": True},
                             {"html": str(hostile_page), "screenshot": None}], tmp_path, chromium, node)
    for shown in seen:
        assert not shown["console_errors"] and not shown["page_errors"], shown
        assert shown["requests"] == [shown["url"]] and not shown["dialogs"] and shown["scripts"] == 0, shown
    starved, hostile = seen
    # The step at each run's pace: the fix's own median step (4.3 ms) is a step its workers fed from their queue.
    assert starved["first_screen"] == ["5.06x faster: step 145.0 ms → 28.6 ms"], starved["first_screen"]
    assert starved["title"] == f"gpudoctor diff — {before} → {after}"
    assert hostile["first_screen"][0].startswith("The same speed: step")
    assert (shots / "diff.png").stat().st_size > 10_000
