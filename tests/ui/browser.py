#!/usr/bin/env python3
"""The dashboard in Chromium, driven through WebDriver (chromedriver) by selenium.

tests/ui/run.sh starts a one-node cluster and runs this with KAT_UI_URL (the node's API),
KAT_UI_CONFIG and KAT_UI_KATCALL (katcall with the admin's config), KAT_UI_EXAMPLE (the example
workload's directory) and KAT_UI_SCREENSHOTS. Each step is named; all run in order on one
browser and one cluster, and the first failure ends the run with its name, a screenshot and
the page's text.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

BASE = os.environ["KAT_UI_URL"] + "/ui"
KATCALL = [os.environ["KAT_UI_KATCALL"], "--config", os.environ["KAT_UI_CONFIG"]]
EXAMPLE = os.environ["KAT_UI_EXAMPLE"]
SHOTS = os.environ["KAT_UI_SCREENSHOTS"]
# A busy machine (the suite runs beside a CPU load once) pulls and starts slower.
READY_WITHIN = 180


def katcall(*args):
    done = subprocess.run(KATCALL + list(args), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"katcall {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def all_current(r):
    """Every instance row of the workload page runs the current spec."""
    return r.d.execute_script(
        "const cells = [...document.querySelectorAll('#instances tbody td:last-child')];"
        "return cells.length > 0 && cells.every((c) => c.innerText.trim() === 'current');"
    )


def spec_text(r):
    return r.d.execute_script(
        "const e = document.querySelector('pre.spec'); return e ? e.textContent : null;"
    )


def generation(name):
    """The workload's generation, as katcall reads it."""
    for w in json.loads(katcall("get", "workloads", "-o", "json")):
        if w["metadata"]["name"] == name:
            return w["metadata"]["generation"]
    raise AssertionError(f"no workload {name}")


def admin_token():
    with open(os.environ["KAT_UI_CONFIG"]) as f:
        for line in f:
            if line.startswith("token:"):
                return line.split(":", 1)[1].strip().strip("'\"")
    raise AssertionError("no token in the admin's katcall config")


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        # The node's certificate is signed by the cluster's own CA.
        "--ignore-certificate-errors",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)


class Run:
    def __init__(self, driver):
        self.d = driver

    def wait(self, what, until, timeout=30):
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.25).until(lambda d: until())
        except TimeoutException:
            raise AssertionError(f"waited {timeout}s for {what}") from None

    # Live updates replace the content under the test's feet: read and click by selector in
    # one step, never through an element found a moment before.
    def text(self, css):
        return self.d.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
        )

    def click(self, css):
        for _ in range(20):
            try:
                self.d.find_element(By.CSS_SELECTOR, css).click()
                return
            except StaleElementReferenceException:
                time.sleep(0.1)
        raise AssertionError(f"{css} kept being replaced")

    def exists(self, css):
        return bool(self.d.find_elements(By.CSS_SELECTOR, css))

    def shot(self, name):
        self.d.save_screenshot(os.path.join(SHOTS, f"{name}.png"))

    def sign_in(self, token):
        self.d.get(BASE + "/login")
        box = self.d.find_element(By.ID, "token")
        box.clear()
        box.send_keys(token)
        self.d.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()

    def sign_out(self):
        started = time.monotonic()
        self.click("header form button")
        self.wait("the sign-in page", lambda: self.d.current_url.endswith("/ui/login"))
        # A click waits for its page: a request stuck behind held connections shows here.
        took = time.monotonic() - started
        assert took < 10, f"signing out took {took:.0f} s"


    def browser_problems(self):
        """Console errors: a CSP violation, a script error, a failed load."""
        return [
            e["message"]
            for e in self.d.get_log("browser")
            if e["level"] == "SEVERE" and "favicon" not in e["message"]
        ]


def only_the_sign_in_page_without_a_session(r):
    for page in ("", "/", "/n/default", "/events", "/backups"):
        r.d.get(BASE + page)
        r.wait(f"{page or '/ui'} to send to the sign-in page", lambda: r.d.current_url.endswith("/ui/login"))
    r.sign_in("not-a-token")
    r.wait("the refusal", lambda: "not a token of this cluster" in r.d.page_source)
    r.shot("sign-in-refused")


def the_admin_signs_in_and_sees_the_node(r):
    r.sign_in(admin_token())
    r.wait("the cluster page", lambda: r.d.current_url.endswith("/ui"))
    r.wait("the node, Ready", lambda: "Ready" in r.text("#nodes tr[data-node]"))
    assert r.exists("#nodes meter"), "usage meters"
    cookies = {c["name"]: c for c in r.d.get_cookies()}
    session = cookies.get("__Host-kat_session")
    assert session, f"a session cookie: {cookies}"
    assert session["httpOnly"] and session["secure"] and session["sameSite"] == "Strict", session
    assert r.d.execute_script("return document.cookie") == "", "no script reads the session"
    r.shot("cluster")


def the_example_becomes_ready(r):
    r.d.get(BASE + "/n/default")
    r.wait("the workloads page", lambda: r.exists("#workloads"))
    katcall("apply", "-f", EXAMPLE)
    # No reload: the row appears and turns ready over the page's live stream.
    r.wait("hello in the list", lambda: r.exists("tr[data-workload=hello]"), timeout=30)
    r.wait("hello ready 1/1", lambda: r.text("tr[data-workload=hello] .ready") == "1/1", timeout=READY_WITHIN)
    r.shot("workloads")


def its_output_is_followed(r):
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("an instance link", lambda: r.exists("#instances a"))
    instance = r.text("#instances a")
    r.click("#instances a")
    r.wait("the instance page", lambda: r.exists("#logs"))
    r.wait("its first line", lambda: "hello from" in r.text("#logs"))
    # A request now (httpd -vv logs each) shows up on the open page.
    marker = f"followed-{int(time.time())}"
    katcall("exec", f"hello/{instance}", "--", "/bin/sh", "-c", f"wget -q -O /dev/null http://127.0.0.1:8080/{marker} || true")
    r.wait("the new line", lambda: marker in r.text("#logs"), timeout=30)
    assert "Running" in r.text("#state"), r.text("#state")
    r.shot("instance")


def a_cli_change_shows_without_a_reload(r):
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("generation 1", lambda: r.text("#generation") == "1")
    r.d.execute_script("window.katSamePage = true")
    changed = EXAMPLE + "-changed"
    os.makedirs(changed, exist_ok=True)
    for name in os.listdir(EXAMPLE):
        with open(os.path.join(EXAMPLE, name)) as f:
            text = f.read()
        with open(os.path.join(changed, name), "w") as f:
            f.write(text.replace("value: hello", "value: howdy"))
    katcall("apply", "-f", changed)
    r.wait("generation 2 on the open page", lambda: r.text("#generation") == "2", timeout=30)
    assert r.d.execute_script("return window.katSamePage === true"), "the page was not reloaded"
    r.wait("the new instance ready", lambda: r.text("#ready") == "1 of 1" and all_current(r), timeout=READY_WITHIN)
    r.shot("workload-updated")


def a_rollback_from_the_page(r):
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("the rollback button", lambda: r.exists("#rollback"))
    r.click("#rollback")
    r.wait("the rollback's message", lambda: "Rolled back: generation 3" in r.text(".flash"))
    assert generation("hello") == 3, generation("hello")
    r.wait("the spec back to hello", lambda: "howdy" not in (spec_text(r) or "howdy"))
    r.wait("ready again", lambda: r.text("#ready") == "1 of 1" and all_current(r), timeout=READY_WITHIN)
    r.shot("workload-rolled-back")


def another_site_cannot_roll_back(r):
    # The admin is signed in; a page of another site (an opaque data: origin here) posts the
    # rollback form, even with the session's own CSRF token in it. The browser sends no
    # cookie (SameSite=Strict) and says it is cross-site; the node refuses it either way.
    r.d.get(BASE + "/n/default/workloads/hello")
    csrf = r.d.execute_script("return document.querySelector('input[name=csrf]').value")
    before = generation("hello")
    target = BASE + "/n/default/workloads/hello/rollback"
    attack = (
        f'<form method="post" action="{target}"><input name="csrf" value="{csrf}"></form>'
        "<script>document.forms[0].submit()</script>"
    )
    r.d.get("data:text/html," + urllib.parse.quote(attack))
    r.wait("the refusal", lambda: "cannot change anything here" in r.d.page_source)
    assert generation("hello") == before, (before, generation("hello"))
    # The dashboard page this tab left for the other site may be kept in the browser's
    # back-forward cache: it must hold no stream there (kat.js closes them on pagehide), or
    # the next requests wait for a connection (the sign-out of the next step took 40 s
    # before it did).
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("the admin still signed in", lambda: r.exists("#rollback"))


def a_read_only_token_sees_no_buttons(r):
    token = json.loads(katcall("create", "token", "--read-only", "-o", "json"))["token"]
    r.sign_out()
    r.sign_in(token)
    r.wait("the cluster page", lambda: r.d.current_url.endswith("/ui"))
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("the workload page", lambda: r.exists("#instances"))
    assert "read-only" in r.text("header"), r.text("header")
    assert not r.exists("#rollback"), "no rollback button"
    nav = r.text("header nav")
    assert "Backups" not in nav and "Join tokens" not in nav, nav
    before = generation("hello")
    # The form is not drawn; a forged one, with this session's own CSRF token, is refused.
    status = r.d.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const csrf = document.querySelector('input[name=csrf]').value;
        fetch('/ui/n/default/workloads/hello/rollback', {
            method: 'POST',
            headers: {'Content-Type': 'application/x-www-form-urlencoded'},
            body: 'csrf=' + encodeURIComponent(csrf),
            redirect: 'manual',
        }).then((r) => done(r.status), (e) => done(String(e)));
        """
    )
    assert status == 403, f"a read-only session's rollback: {status}"
    assert generation("hello") == before, (before, generation("hello"))
    r.d.get(BASE + "/backups")
    assert "Not for this token" in r.d.page_source
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("the workload page", lambda: r.exists("#instances"))
    r.shot("read-only")


def readable_on_a_phone_and_in_the_dark(r):
    r.d.set_window_size(390, 844)
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("the workload page", lambda: r.exists("#instances"))
    overflow = r.d.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page is {overflow}px wider than a phone (tables scroll in their box)"
    r.shot("phone")
    light = r.d.execute_script("return getComputedStyle(document.body).backgroundColor")
    r.d.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
    )
    dark = r.d.execute_script("return getComputedStyle(document.body).backgroundColor")
    assert light != dark, f"the same background in light and dark: {light}"
    r.d.set_window_size(1280, 900)
    r.d.get(BASE + "/n/default/workloads/hello")
    r.wait("the workload page", lambda: r.exists("#instances"))
    r.shot("dark")
    r.d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def nothing_was_refused_by_the_browser(r):
    # Every page was loaded under the Content-Security-Policy: a violation, a script error
    # or a failed asset would be in the console.
    # The refused sign-in's 401, and the read-only token's 403s (the forged POST, the
    # backups page), are what the steps asked for.
    expected = ("/ui/login - Failed to load resource: the server responded with a status of 401",
                "/rollback - Failed to load resource: the server responded with a status of 403",
                "/ui/backups - Failed to load resource: the server responded with a status of 403")
    problems = [p for p in r.browser_problems() if not any(e in p for e in expected)]
    assert not problems, "\n".join(problems)


STEPS = [
    only_the_sign_in_page_without_a_session,
    the_admin_signs_in_and_sees_the_node,
    the_example_becomes_ready,
    its_output_is_followed,
    a_cli_change_shows_without_a_reload,
    a_rollback_from_the_page,
    another_site_cannot_roll_back,
    a_read_only_token_sees_no_buttons,
    readable_on_a_phone_and_in_the_dark,
    nothing_was_refused_by_the_browser,
]


def main():
    driver = browser()
    r = Run(driver)
    started = time.monotonic()
    try:
        for step in STEPS:
            t = time.monotonic()
            try:
                step(r)
            except Exception as e:  # a failed step: say which, keep what the page showed
                r.shot(f"failed-{step.__name__}")
                print(f"FAILED {step.__name__}: {e}", file=sys.stderr)
                print(f"  at {driver.current_url}; the page says:", file=sys.stderr)
                body = driver.find_elements(By.TAG_NAME, "body")
                print(re.sub(r"\n+", "\n", body[0].text if body else "")[:3000], file=sys.stderr)
                return 1
            print(f"ok {step.__name__} ({time.monotonic() - t:.1f} s)")
    finally:
        driver.quit()
    print(f"tests/ui: {len(STEPS)} steps passed in {time.monotonic() - started:.0f} s; screenshots in {SHOTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
