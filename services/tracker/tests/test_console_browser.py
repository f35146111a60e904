"""The console in headless Chromium (Debian's package): the pages render the demo run's data
from the API with the token, and ask for a token without one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from prorsa_tracker import console_browser as cb
from prorsa_tracker.api import serve_api
from prorsa_tracker.console_live import Hub

pytestmark = pytest.mark.skipif(not Path(cb.CHROMIUM).exists(),
                                reason=f"no Chromium at {cb.CHROMIUM}: apt-get install chromium (or set PRORSA_CHROMIUM)")


def test_console_pages_render_the_demo_run_in_chromium(tmp_path) -> None:
    db = cb.build_demo_db(tmp_path, until=57.0)
    port = cb.free_port()
    with serve_api(db, "s3cret", "127.0.0.1", port):
        base = f"http://127.0.0.1:{port}"
        cb.wait_http(f"{base}/healthz")

        dom = cb.dump_dom(base, "#/run/demo", "s3cret")
        assert 'id="run-title">Run demo<' in dom
        assert "2P : 2D" in dom  # engines per role after the last switch
        assert "Role switches (3)" in dom and "failed: drain deadline passed" in dom
        assert "live<b>23</b>" in dom and "done<b>92</b>" in dom  # trajectories by state
        assert dom.count('data-series="prefill"') == 1 and dom.count('data-series="actual"') == 3
        assert 'href="#/run/demo/traj/t3"' in dom

        dom = cb.dump_dom(base, "#/run/demo/traj/t3", "s3cret")
        assert 'id="traj-title">Trajectory t3<' in dom
        assert "reward.finished" in dom and "t3-q2" in dom

        dom = cb.dump_dom(base, "#/run/demo", None)  # no token: a form, no data
        main = dom[dom.index('<main id="main">'):dom.index("</main>")]
        assert '<form id="login-form"' in main and "Run demo" not in dom
        dom = cb.dump_dom(base, "#/run/demo", "wrong")
        main = dom[dom.index('<main id="main">'):dom.index("</main>")]
        assert '<form id="login-form"' in main and "the token was refused" in main and "Run demo" not in dom


def test_console_page_shows_live_notices_from_the_stream(tmp_path) -> None:
    # The hub is fed here directly (test_console.py feeds it from a tracker through NATS):
    # this checks the page's side, reading the stream with the token and showing notices.
    db = cb.build_demo_db(tmp_path, until=57.0)
    hub, stop, port = Hub(), threading.Event(), cb.free_port()

    def feed() -> None:
        seq = 0
        while not stop.wait(0.1):
            seq += 1
            hub.publish([(seq, f"x{seq}", "demo", "t200", "request.queued", 1_796_100_060.0 + seq, b"{}"),
                         (seq, f"y{seq}", "other", "t1", "request.queued", 1.0, b"{}")])

    with serve_api(db, "s3cret", "127.0.0.1", port, hub):
        base = f"http://127.0.0.1:{port}"
        cb.wait_http(f"{base}/healthz")
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            # The stream's messages arrive in real time, so the page is driven over the DevTools
            # pipe and polled in real time until its feed shows one (not on a virtual clock).
            with cb.Browser() as browser:
                tab = browser.open(cb.page_url(base, "#/run/demo", "s3cret"))
                dom = tab.wait_for("request.queued×", timeout=60)
        finally:
            stop.set()
            feeder.join(5)
    feed_html = dom[dom.index('id="feed"'):]
    feed_html = feed_html[:feed_html.index("</section>")]
    assert "demo  request.queued×1" in feed_html and "other" not in feed_html
    assert 'class="live on"' in dom and ">live: " in dom
