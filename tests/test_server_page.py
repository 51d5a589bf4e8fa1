"""The chat page at / in headless Chromium (Debian's chromium + chromedriver, driven by selenium): type a message,
see the reply stream in, and Stop cancels the generation on the server; while the server says it is compiling its
batched kernels (/health "compiling"), the header says it is warming up, until it is done."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from live_server import LiveServer, ModelWrapper
from synthetic import write_model

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOT = os.environ.get("GGUFRUN_PAGE_SCREENSHOT")  # set to a .png path to keep a picture of the page

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import ggufrun
    from ggufrun.server import create_app

    path = write_model(tmp_path_factory.mktemp("page") / "page-model.gguf", tokenizer="bytes", ctx=512)
    model = ggufrun.load(path, n_ctx=512, n_threads=1)
    # 40 ms per token and no end-of-turn token, so that the reply is still streaming when Stop is clicked
    slow = ModelWrapper(model, delay=0.04, sampling={"logit_bias": {t: float("-inf") for t in model.tokenizer.eog_ids}})
    with LiveServer(create_app(slow, model_id="page-model")) as s:
        s.model = model
        yield s
    model.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1000,700", f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    yield driver
    driver.quit()


def wait_for(condition, timeout=20.0, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def health(server) -> dict:
    import httpx

    return httpx.get(server.url + "/health").json()


def test_type_stream_and_stop(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(server.url + "/")
    find = browser.find_element
    wait_for(lambda: find(By.ID, "model").text == "page-model", what="the model id from /v1/models")
    find(By.ID, "input").send_keys("Hello there", Keys.ENTER)
    wait_for(lambda: find(By.CSS_SELECTOR, ".msg.user").text == "Hello there", what="the user's message")

    def reply() -> str:
        return browser.execute_script("return document.querySelector('.msg.assistant').firstChild?.nodeValue || ''")

    first = wait_for(lambda: len(reply()) >= 3 and reply(), what="streamed text")
    wait_for(lambda: len(reply()) > len(first), what="more streamed text")  # it streams, not one block
    assert find(By.ID, "stop").is_enabled() and not find(By.ID, "send").is_enabled()
    assert health(server)["busy"]
    if SCREENSHOT:
        browser.save_screenshot(SCREENSHOT)

    find(By.ID, "stop").click()
    wait_for(lambda: "(stopped)" in find(By.CSS_SELECTOR, ".msg.assistant").text, what="the stopped note")
    assert find(By.ID, "send").is_enabled() and not find(By.ID, "stop").is_enabled()
    wait_for(lambda: not health(server)["busy"], timeout=2.0, what="the server to stop generating")
    stopped, text = health(server), reply()
    time.sleep(0.5)
    assert health(server)["tokens_generated"] == stopped["tokens_generated"] and reply() == text
    assert stopped["requests_cancelled"] >= 1


def test_the_page_says_it_is_warming_up_while_the_server_compiles(server, browser):
    from selenium.webdriver.common.by import By

    warming = lambda: browser.find_element(By.ID, "warming").is_displayed()  # noqa: E731
    browser.get(server.url + "/")
    wait_for(lambda: browser.find_element(By.ID, "model").text == "page-model", what="the model id from /v1/models")
    assert not warming()  # nothing compiling: no note
    from test_first_run import Compiling

    tf = server.model.transformer
    helper = Compiling(after=-1, busy=1)  # running, every kernel it holds already ready (passes run as usual)
    tf.pending = helper
    try:
        browser.get(server.url + "/")
        wait_for(warming, what="the warming-up note while /health says compiling")
        assert "warming up" in browser.find_element(By.ID, "warming").text
        helper.busy = 0  # the helper is done: the page's next look at /health (every 2 s) takes the note away
        wait_for(lambda: not warming(), timeout=10.0, what="the note to go once /health says compiled")
    finally:
        tf.pending = None
