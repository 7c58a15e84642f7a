"""``zerolib app`` under its visitors, without a browser: plain GETs of the page, as a script or a
careless link checker sends them. Each admitted visit starts a kernel that no page will ever
close, so the idle culler must reclaim it; no more than ``--max-visitors`` kernels may live at
once, the rest get the one-line busy page; afterwards the kernel count and the memory of the
server and everything below it are back at their baseline. (On main before issue 35, 25 such
GETs after 25 browser visits left 50 kernels and 7.8 GB alive until the server stopped.)

The browser's side (pages closed, two visitors at once) is tests/browser/test_app_page.py."""
from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from app_support import RSS_SLACK, get, kernels_and_rss, settled_baseline, wait_until, zerolib_app

pytestmark = pytest.mark.slow

VISITS = 25            # per burst; two bursts
MAX_VISITORS = 3
# The culler looks every 1 s (a tenth of it, at least 1 s). Short, but longer than a page takes
# to start its kernel and run its cell on a loaded machine, during which the kernel sends nothing
# (and a kernel busy beyond its idle time is culled too).
IDLE_SECONDS = 15
SETTLE_SECONDS = 3


def _burst(app, count: int) -> tuple[Counter, int, list[str]]:
    """``count`` GETs at once: (statuses, most kernels seen alive meanwhile, the busy pages)."""
    most, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            most[0] = max(most[0], kernels_and_rss(app)[0])
            done.wait(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(count) as pool:
            answers = list(pool.map(lambda i: get(app.address(query=f"gpus={8 * (i + 1)}")),
                                    range(count)))
    finally:
        done.set()
        sampler.join()
    return (Counter(status for status, _ in answers), most[0],
            [body for status, body in answers if status == 503])


def test_fifty_plain_visits_are_bounded_and_reclaimed(tmp_path):
    with zerolib_app(tmp_path, "--max-visitors", str(MAX_VISITORS),
                     "--idle-timeout", str(IDLE_SECONDS)) as app:
        kernels, baseline = settled_baseline(app)
        assert kernels == 0
        seen = []
        for _ in range(2):
            statuses, most, busy = _burst(app, VISITS)
            assert statuses == {200: MAX_VISITORS, 503: VISITS - MAX_VISITORS}, statuses
            assert most <= MAX_VISITORS
            assert all("The page is busy: 3 visitors already have it open" in page
                       and page.count("<p>") == 1 for page in busy)
            # No page will close these kernels: the culler takes them after their idle time.
            assert wait_until(lambda: kernels_and_rss(app)[0] == 0, IDLE_SECONDS + 30)
            # The server forgets a kernel a moment after its process has gone (its files
            # removed): until then it still counts it, rightly.
            time.sleep(SETTLE_SECONDS)
            seen.append((statuses[200], most, kernels_and_rss(app)[1]))
        print(f"\nplain GETs: baseline 0 kernels, {baseline / 1e6:.0f} MB; after each burst of "
              f"{VISITS}: " + "; ".join(f"{ok} admitted, at most {most} kernels, back to 0 kernels "
                                        f"and {rss / 1e6:.0f} MB" for ok, most, rss in seen))
        for _, _, rss in seen:
            assert rss <= baseline + RSS_SLACK, (rss, baseline)
        assert get(app.address())[0] == 200      # and the next visitor is served
