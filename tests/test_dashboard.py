"""The dashboard in a real browser (Playwright driving Debian's chromium) against a live
``stayer serve``: sign in, see runs, follow one live, approve its calls, talk to it, and
show run data as text, never as markup."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from service_helpers import Env, copy_tasks, start_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (dev extra)"
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (.ci/run installs Debian's)"
)

XSS = '<img src=x onerror="window.pwned=1">'
HANG_S = 240.0


def until(page, predicate: str) -> None:  # noqa: ANN001
    """Poll ``predicate`` (a JS expression) in the page. Not wait_for_function: that evals a
    string inside the page, which the dashboard's Content-Security-Policy rightly forbids."""
    import time

    deadline = time.monotonic() + HANG_S
    while not page.evaluate(f"() => Boolean({predicate})"):
        if time.monotonic() > deadline:
            raise AssertionError(f"never true: {predicate}")
        page.wait_for_timeout(100)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    tasks = copy_tasks(tmp_path_factory.mktemp("tasks"), "hello-file")
    env = Env(tmp_path_factory.mktemp("dash") / "home")
    server = start_server(env, tasks, "--workers", "2")
    yield server
    server.process.kill()


@pytest.fixture(scope="module")
def browser():  # noqa: ANN201
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def test_a_person_follows_approves_and_talks_to_a_run_in_the_browser(
    service, browser, tmp_path: Path
) -> None:
    key = service.env.tenant("t" + uuid.uuid4().hex[:8])["api_key"]
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(service.url + "/")
    page.fill("#key", "sk-stayer-wrong")
    page.click("#login-form button")
    until(page, "document.getElementById('login-error').textContent.includes('refused')")
    errors.clear()  # the refused key's 401 is logged by the browser itself
    page.fill("#key", key)
    page.click("#login-form button")
    page.wait_for_selector("#runs:not([hidden])")

    # Start a run whose bash calls wait for a person.
    page.fill("#new-task", "hello-file")
    page.check("#new-confirm")
    page.click("#new-run button")
    page.wait_for_selector("#run:not([hidden])")
    page.wait_for_selector("#action:not([hidden])", timeout=240_000)
    assert "bash" in page.text_content("#action-tool")
    assert "prompt cache expires" in page.text_content("#action-cost")
    page.fill("#say-text", XSS)
    page.click("#say button")
    while True:  # approve every call it asks for, until it ends
        until(
            page,
            "!document.getElementById('action').hidden || ['succeeded','failed','error','cancelled']"
            ".some(s => document.getElementById('run-status').textContent.startsWith(s))",
        )
        if page.is_hidden("#action"):
            break
        page.click("#approve")
        until(page, "document.getElementById('action').hidden")
    until(page, "document.getElementById('run-status').textContent.startsWith('succeeded')")
    until(page, "document.querySelectorAll('#plot polyline').length === 3")
    transcript = page.text_content("#transcript")
    assert XSS in transcript  # shown as text …
    assert page.evaluate("window.pwned") is None  # … never run
    assert page.query_selector("#transcript img") is None
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)

    page.goto(service.url + "/#/")
    page.wait_for_selector("#runs-body tr")
    assert "succeeded" in page.text_content("#runs-body")
    assert errors == []


def test_the_dashboard_is_served_with_a_strict_policy(service) -> None:
    import httpx

    r = httpx.get(service.url + "/")
    assert r.status_code == 200 and "stayer" in r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(service.url + "/static/../../../../etc/passwd").status_code == 404
    assert httpx.get(service.url + "/static/%2e%2e/api.py").status_code == 404
