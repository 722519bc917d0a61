"""The page people open: loads offline from this origin, generates, streams, shows stats."""
from browser_fixture import browser_page, chromium_browser, http_server  # noqa: F401


def test_page_generates_offline_and_shows_stats(browser_page, http_server, tmp_path):
    page = browser_page
    foreign = []
    page.on("request", lambda req: None if req.url.startswith(http_server.url) or req.url.startswith("data:")
            else foreign.append(req.url))
    page.set_default_timeout(300_000)
    page.goto(http_server.url + "/")
    page.wait_for_function("() => window.appReady === true")
    page.fill("#prompt", "And God said")
    page.fill("#max_new_tokens", "12")
    page.click("#go")
    page.wait_for_function("() => document.getElementById('status').textContent === 'done'")
    assert len(page.text_content("#output")) > 0
    stats = page.text_content("#stats")
    assert "accepted / proposed" in stats and "tokens per round" in stats
    receipt = page.text_content("#receipt")
    assert "champion_artifact_hash" in receipt and "And God said" not in receipt
    page.screenshot(path=str(tmp_path / "page.png"))
    assert foreign == [], foreign
    assert not [m for m in page.console_log if m[0] in ("error", "pageerror")], page.console_log
