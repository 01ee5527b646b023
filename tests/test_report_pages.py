"""The eval and audit HTML reports open in a real browser (headless Chromium) without errors.

Chromium is the system's (Debian's ``chromium``, installed by .ci/run); Playwright only
drives it, it downloads no browser."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = (
    os.environ.get("STAYER_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on this machine (apt install chromium)"
)


def stayer(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env["STAYER_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=600,
    )


def test_eval_and_audit_reports_render_in_chromium_without_errors(tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    home, out = tmp_path / "home", tmp_path / "eval"
    r = stayer(
        "eval",
        str(ROOT / "examples" / "hello-file"),
        "--model",
        "sim:gpt-5,sim:claude-sonnet-4-5",
        "--out",
        str(out),
        home=home,
    )
    assert r.returncode == 0, r.stderr
    audit = tmp_path / "audit.html"
    a = stayer(
        "audit",
        str(home / "runs"),
        "--html",
        str(audit),
        "--what-if",
        "model=claude-haiku-4-5,policy=auto",
        home=home,
    )
    assert a.returncode == 0, a.stderr
    [run_page] = sorted((out / "runs").glob("*.html"))[:1]
    pages = {
        "eval": (out / "report.html", ["total cost", "Cost vs success", "Trials"]),
        "run": (run_page, ["Per step", "Transcript"]),
        "audit": (audit, ["total cost", "Tokens", "Costliest calls", "What-if"]),
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url}"))
            for name, (path, headings) in pages.items():
                page.goto(path.as_uri())
                text = page.inner_text("body")
                for h in headings:
                    assert h in text, (name, h)
                assert "None" not in text, name
                shot = tmp_path / f"{name}.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000, name  # something was drawn
                # the plots are real SVG the browser laid out, with room for their labels
                for box in page.locator("svg").evaluate_all(
                    "els => els.map(e => e.getBBox().width)"
                ):
                    assert box > 100, name
            # the trial table links to the run pages
            page.goto((out / "report.html").as_uri())
            page.click("a[href^='runs/']")
            assert "Transcript" in page.inner_text("body")
        finally:
            browser.close()
    assert errors == []
