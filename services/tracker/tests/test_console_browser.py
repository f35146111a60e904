"""The console in headless Chromium (Debian's package): the pages render the demo run's data
from the API with the token, and ask for a token without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorsa_tracker import console_browser as cb
from prorsa_tracker.api import serve_api

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
