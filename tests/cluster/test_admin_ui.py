"""The admin UI (node/api/admin.html) in a real browser, against real clusters on loopback.

Playwright drives Debian's Chromium (`apt-get install chromium`; `executable_path`, never a
browser download). Without Playwright or Chromium the browser tests skip and say why; the API
tests at the end (the routes the page relies on) run anyway.

Covered: the page loads (from a follower it moves to the leader); the node table, the queue
table and the rate chart; the job browser (pages, states, search by id, payloads decoded by
encoding); every action (cancel, retry now, dead-letter, requeue and delete selected and all,
enqueue a test job, pause and resume; dead-letter of ready and scheduled jobs with a reason, purge
and delete of a queue, each asked first and left alone when the dialog is dismissed); the audit
tab (newest first, older pages, who by key name, the permission message for a viewer); the schedules panel
(create through the form, fired growing, pause, trigger, delete with its version and a stale one refused,
a 400's field shown by the form, markup shown as text); dead letters by queue and cause with filters that clear,
and a table that refreshes by itself; the notice when the cluster keeps no dead letters; API keys
(asked for, kept in the tab's sessionStorage, sent as Bearer, a role too low explained); the
leader killed under an open page (marked stale, then moved to a live node with the key and the
panel choices). Every page is checked for script errors and for listings that ask for more than
a page.

On failure a screenshot and the page's HTML are saved under $RAFTQ_UI_ARTIFACTS (default
<tmp>/raftq-ui-artifacts) and the test's output says where.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from raftq.cluster.local import LocalCluster, http_json
from tests.conftest import Api, poll

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright
except ImportError:                 # the browser tests skip; the API tests still run
    sync_playwright = None

CHROMIUM = os.environ.get("RAFTQ_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("RAFTQ_UI_ARTIFACTS") or Path(tempfile.gettempdir()) / "raftq-ui-artifacts")
RETENTION = {"dead_letter_retention_ms": 86_400_000}
DECLARED = "ui-declared-" + uuid.uuid4().hex[:6]     # a [[queues]] entry of the module's cluster
KEYED = {"name": "ui-keyed-" + uuid.uuid4().hex[:6], "key_concurrency": 1, "key_weights": {"acme": 2},
         "key_rate": {"count": 100, "period_ms": 600_000}}     # another, with key limits
KEYS = {role: f"{role}-ui-{uuid.uuid4().hex[:8]}" for role in ("viewer", "operator", "admin")}
API_KEYS = [{"name": f"{role}-app", "key": key, "role": role} for role, key in KEYS.items()]
if sync_playwright is not None:
    expect.set_options(timeout=20_000)      # a loaded CI machine; every wait polls, none sleeps
# Said before any cluster starts for them (the browser fixture skips too, when Chromium is there
# but does not start).
needs_browser = pytest.mark.skipif(
    sync_playwright is None or not CHROMIUM,
    reason="playwright is not installed (pip install -e '.[test]')" if sync_playwright is None else
    "Chromium is not installed (apt-get install chromium): the admin UI's browser tests need it")


def qname() -> str:
    return "ui-" + uuid.uuid4().hex[:8]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def bearer(role):
    return {"Authorization": f"Bearer {KEYS[role]}"}


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def browser():
    if sync_playwright is None:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    if not CHROMIUM:
        pytest.skip("Chromium is not installed (apt-get install chromium): the admin UI's browser tests need it")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        except PlaywrightError as e:
            pytest.skip(f"Chromium at {CHROMIUM} does not start under Playwright: {str(e).splitlines()[0]}")
        yield b
        b.close()


class UI:
    """One browser tab and what it saw: script errors, dialogs, listing calls, the calls that
    change something. A dialog is answered from `answers` when it holds any (False: dismissed,
    a string: accepted with that text typed into a prompt, True: accepted, a function: called
    while the dialog is open, then accepted), else accepted (a prompt with its default text)."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.answers: list = []
        self.listings: list[str] = []
        self.changes: list[tuple[str, str, object]] = []     # (method, path, JSON body) of non-GET /v1 calls
        self.auth_headers: list[str | None] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", self._dialog)
        self.page.on("request", self._request)

    def _dialog(self, d):
        self.dialogs.append(d.message)
        answer = self.answers.pop(0) if self.answers else True
        if callable(answer):            # done while the dialog holds the page (no refresh runs meanwhile)
            answer = answer() is not False
        if answer is False:
            d.dismiss()
        elif isinstance(answer, str):
            d.accept(answer)
        else:
            d.accept(d.default_value if d.type == "prompt" else None)

    def _request(self, r):
        path = urlsplit(r.url).path
        if path.startswith("/v1/"):
            self.auth_headers.append(r.headers.get("authorization"))
        if (path.endswith("/jobs") or re.fullmatch(r"/v1/queues/[^/]+/keys", path)) and r.method == "GET" \
                or path in ("/v1/dead-letters", "/v1/audit", "/v1/schedules"):
            self.listings.append(r.url)
        if path.startswith("/v1/") and r.method != "GET":
            self.changes.append((r.method, path, json.loads(r.post_data) if r.post_data else None))

    def open(self, url: str):
        """Load the page and wait for a leader's data."""
        self.page.goto(url + "/")
        self.wait_fresh()
        return self.page

    def wait_fresh(self):
        expect(self.page.locator("body")).to_have_attribute("data-stale", "false")
        expect(self.page.locator("#here .badge")).to_have_text("leader")

    def msg(self):
        return self.page.locator("#msg")

    def calls(self, method, path):
        return [body for m, p, body in self.changes if m == method and p == path]

    def wait_dialogs(self, n):
        """Until n dialogs in all were shown (and answered)."""
        poll(lambda: len(self.dialogs) >= n, timeout=20, what=f"{n} dialogs (seen {self.dialogs})")


@pytest.fixture
def ui(browser, request):
    u = UI(browser)
    yield u
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        base = ARTIFACTS / re.sub(r"[^\w.-]+", "_", request.node.name)
        try:
            u.page.screenshot(path=f"{base}.png", full_page=True)
            Path(f"{base}.html").write_text(u.page.content())
            print(f"admin UI at failure: {base}.png and {base}.html (page {u.page.url}); script errors: {u.errors}")
        except PlaywrightError as e:
            print(f"no screenshot of the failure: {e}")
    u.context.close()
    if rep is not None and rep.passed:
        assert u.errors == [], "the page raised script errors"
        # never a whole queue: every listing asks for one page
        for url in u.listings:
            limit = parse_qs(urlsplit(url).query).get("limit", [None])[0]
            assert limit is not None and int(limit) <= 100, url


def launch_all(directory, **kw) -> LocalCluster:
    """A cluster with all three nodes up. LocalCluster.launch() waits for a leader, which two nodes
    make; the node table, the kill test and the fan-out need the third too. A node that did not
    come up (on a shared machine its free port can be taken before it binds) is told, with its log,
    and the cluster starts again on other ports, once."""
    for attempt in range(2):
        c = LocalCluster(Path(directory) / f"try{attempt}", **kw).launch()
        try:
            poll(lambda: all(c.alive(i) and c.cluster_view(i, digest=False) for i in range(c.n)),
                 timeout=20, what="every node answering")
            return c
        except AssertionError:
            logs = {c.ids[i]: c.log_path(i).read_text()[-1500:] for i in range(c.n) if not c.alive(i)}
            c.close()
            if attempt:
                raise AssertionError(f"nodes did not come up: {logs}") from None
            print(f"nodes {sorted(logs)} did not come up, starting again on other ports; their logs: {logs}")


@pytest.fixture
def fresh_cluster(tmp_path):
    made = []

    def make(**kw):
        made.append(launch_all(tmp_path / f"c{len(made)}", **kw))
        return made[-1]
    yield make
    for c in made:
        c.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = launch_all(tmp_path_factory.mktemp("ui"), durability="memory", storage=RETENTION,
                   queues=[{"name": DECLARED}, KEYED])
    yield c
    c.close()


@pytest.fixture(scope="module")
def api(cluster):
    return Api(cluster)


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory):
    # keys on, and no dead-letter store (the default retention of 0)
    c = launch_all(tmp_path_factory.mktemp("ui-auth"), durability="memory", api_keys=API_KEYS)
    yield c
    c.close()


def leader_url(cluster) -> str:
    return cluster.urls[cluster.wait_leader(20)]


def follower_index(cluster) -> int:
    lead = cluster.wait_leader(20)
    return next(i for i in range(cluster.n) if i != lead and cluster.alive(i))


def enqueue(api, queue, n=1, payload=None, encoding="application/json", headers=None, **fields):
    """n jobs in one batch; their ids."""
    job = {"queue": queue, "job_type": "t", **fields}
    if payload is not None:
        job["payload"] = {"data_b64": b64(payload), "encoding": encoding}
    status, out = api.post("/v1/jobs/batch", {"jobs": [job] * n}, headers=headers)
    assert status == 200, out
    return [r["job_id"] for r in out["results"]]


def reserve_all(api, queue, headers=None, lease_ms=300_000, max_jobs=100):
    status, out = api.post("/v1/reserve", {"queues": [queue], "lease_ms": lease_ms, "max_jobs": max_jobs},
                           headers=headers)
    assert status == 200, out
    return out["jobs"]


def dead_letter(api, queue, cause, reason="boom"):
    """A dead letter of `queue` with cause `rejected` or `attempts_exhausted`; its id."""
    [jid] = enqueue(api, queue, max_attempts=1 if cause == "attempts_exhausted" else 3, payload=b"a,b\n1,2",
                    encoding="text/csv")
    [job] = reserve_all(api, queue)
    assert job["id"] == jid
    retry = {"strategy": "dead_letter"} if cause == "rejected" else {"strategy": "default"}
    status, out = api.post(f"/v1/jobs/{jid}/nack", {"attempt": job["attempt"], "reason": reason, "retry": retry})
    assert status == 200 and out["dead_lettered"], out
    return jid


def job_state(api, jid, headers=None):
    status, out = api.get(f"/v1/jobs/{jid}", headers=headers)
    return out["state"] if status == 200 else status


def select_rows(page, table: str, ids):
    for jid in ids:
        page.locator(f"#{table} tbody input[value='{jid}']").check()


def compact(obj) -> str:
    """JSON as the page's JSON.stringify writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def iso_utc(ms: int) -> str:
    """The instant as the page's Date.toISOString() writes it."""
    return datetime.fromtimestamp(ms // 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


MOVED = "dead-lettered {} job(s), {} missing (no longer ready or scheduled)"


# ------------------------------------------------------------------------------ the page
@needs_browser
def test_page_from_a_follower_moves_to_the_leader_and_shows_nodes_queues_and_rates(cluster, api, ui):
    q = qname()
    enqueue(api, q, 3)
    lead = cluster.wait_leader(20)
    page = ui.open(cluster.urls[follower_index(cluster)])
    expect(page).to_have_url(cluster.urls[lead] + "/")       # moved itself to the leader's page
    # the node table: one row per member, from each member's own view
    rows = page.locator("#nodes tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator(f"#nodes tr[data-node='{cluster.ids[lead]}'] .badge")).to_have_text("leader")
    expect(page.locator("#nodes tbody .badge.follower")).to_have_count(2)
    view = cluster.cluster_view(lead, digest=False)
    first = rows.nth(0).locator("td")
    expect(first.nth(2)).to_have_text(str(view["term"]))
    expect(first.nth(3)).to_have_text(re.compile(r"^[\d,]+$"))      # commit index
    expect(first.nth(5)).to_have_text(re.compile(r"^\d+$"))         # lag
    expect(page.locator("#cluster-sum")).to_contain_text("3 of 3 answering")
    # the queue's row holds its counts
    row = page.locator(f"#queues tr[data-queue='{q}'] td")
    expect(row.nth(1)).to_have_text("3")
    expect(row.nth(5)).to_have_text("3")
    # rates: jobs enqueued and acked while the page watches show up as non-zero rates and lines
    # (each reading shows the last ~10 s: the checks below all see the reading after the burst)
    page.select_option("#chart-queue", q)                             # the chart of this queue
    enqueue(api, q, 40)
    acks = [{"job_id": j["id"], "attempt": j["attempt"]} for j in reserve_all(api, q)]
    assert api.post("/v1/acks", {"acks": acks})[0] == 200
    nonzero = re.compile(r"^(0\.[1-9]|[1-9])")
    expect(page.locator("#legend [data-rate='enqueue']")).to_have_text(nonzero)
    expect(page.locator("#legend [data-rate='ack']")).to_have_text(nonzero)
    expect(row.nth(8)).to_have_text(nonzero)                          # the queue's own enq/s
    expect(page.locator("#chart polyline")).to_have_count(4)
    expect(page.locator("#dl-off")).to_be_hidden()                    # this cluster keeps dead letters


@needs_browser
def test_job_browser_pages_states_search_and_decoded_payloads(cluster, api, ui):
    q = qname()
    ready = enqueue(api, q, 120, payload=json.dumps({"user": 7, "tags": ["a"]}).encode())
    later = enqueue(api, q, 3, payload="first line\nsecond line".encode(), encoding="text/plain",
                    delay_ms=3_600_000)
    enqueue(api, q, 2, payload=bytes(range(40)), encoding="application/octet-stream", priority=9)
    flying = reserve_all(api, q, max_jobs=2)    # the two priority-9 binary jobs come first
    assert {j["payload"]["encoding"] for j in flying} == {"application/octet-stream"}
    page = ui.open(leader_url(cluster))
    page.select_option("#jb-queue", q)
    rows = page.locator("#jobs tbody tr[data-id]")
    expect(rows).to_have_count(50)
    expect(page.locator("#jb-page")).to_have_text("page 1 of 3")
    status, first = api.get(f"/v1/queues/{q}/jobs?limit=50")
    expect(rows.nth(0)).to_have_attribute("data-id", first["jobs"][0]["id"])   # delivery order
    expect(rows.nth(49)).to_have_attribute("data-id", first["jobs"][49]["id"])
    page.click("#jb-next")
    expect(page.locator("#jb-page")).to_have_text("page 2 of 3")
    expect(rows.nth(0)).to_have_attribute("data-id", ready[50])
    page.click("#jb-next")
    expect(rows).to_have_count(20)
    expect(page.locator("#jb-next")).to_be_disabled()
    page.click("#jb-prev")
    expect(rows.nth(0)).to_have_attribute("data-id", ready[50])
    page.click("#jb-first")
    expect(rows.nth(0)).to_have_attribute("data-id", ready[0])
    # JSON pretty-printed
    page.locator(f"#jobs a[data-show='{ready[0]}']").click()
    expect(page.locator("#payload")).to_have_attribute("data-kind", "json")
    expect(page.locator("#payload")).to_have_text('{\n  "user": 7,\n  "tags": [\n    "a"\n  ]\n}')
    # scheduled: text as text
    page.click("#jb-states button[data-state=scheduled]")
    expect(rows).to_have_count(3)
    page.locator(f"#jobs a[data-show='{later[0]}']").click()
    expect(page.locator("#payload")).to_have_attribute("data-kind", "text")
    expect(page.locator("#payload")).to_have_text("first line\nsecond line")
    expect(page.locator("#detail")).to_contain_text("runs at")
    # in flight: binary as hex
    page.click("#jb-states button[data-state=in_flight]")
    expect(rows).to_have_count(2)
    page.locator(f"#jobs a[data-show='{flying[0]['id']}']").click()
    expect(page.locator("#payload")).to_have_attribute("data-kind", "hex")
    expect(page.locator("#payload")).to_contain_text("000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f")
    # search by id (any case), a malformed id, an unknown one
    page.fill("#search-id", later[1].upper())
    page.click("#search button")
    expect(page.locator("#detail-of")).to_contain_text(later[1])
    expect(page.locator("#detail")).to_contain_text("scheduled")
    page.fill("#search-id", "not-an-id")
    page.click("#search button")
    expect(ui.msg()).to_contain_text("is not a job id")
    gone = str(uuid.uuid4())
    page.fill("#search-id", gone)
    page.click("#search button")
    expect(page.locator("#detail")).to_contain_text(f"No job {gone}")


@needs_browser
def test_a_job_shows_its_dependencies_its_result_and_its_batch(cluster, api, ui):
    """docs/semantics.md "Workflows" in the job panel: a dependent's depends_on (links) and
    waiting_on, a dependency kept for it with its result, a callback job's batch status."""
    q = qname()
    first = api.enqueue(q, data=b"{}")[1]["job_id"]
    status, out = api.post("/v1/jobs", {"queue": q, "job_type": "then", "depends_on": [first]})
    then = out["job_id"]
    page = ui.open(leader_url(cluster))
    page.fill("#search-id", then)
    page.click("#search button")
    expect(page.locator("#detail")).to_contain_text("waiting on")
    expect(page.locator(f"#detail a[data-job='{first}']")).to_have_count(2)      # depends on, waiting on
    job = api.reserve([q])[1]["jobs"][0]
    body = {"attempt": job["attempt"], "result": {"data_b64": b64(b'{"rows": 3}'), "encoding": "application/json"}}
    assert api.post(f"/v1/jobs/{first}/ack", body)[0] == 200
    page.locator(f"#detail a[data-job='{first}']").first.click()
    expect(page.locator("#detail-of")).to_contain_text("succeeded")
    expect(page.locator("#result")).to_have_text('{\n  "rows": 3\n}')
    expect(page.locator("#detail")).to_contain_text("1 live dependent job(s)")
    status, out = api.post("/v1/batches", {"jobs": [{"queue": q, "job_type": "part"}],
                                           "callbacks": {"on_complete": {"queue": q, "job_type": "done"}}})
    bid = out["batch_id"]
    for _ in range(2):                      # `then` (ready now) and the part, whichever comes first
        job = api.reserve([q])[1]["jobs"][0]
        assert api.post(f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]})[0] == 200
    callback = api.get(f"/v1/batches/{bid}")[1]["callbacks"]["on_complete"]["job_id"]
    page.fill("#search-id", callback)
    page.click("#search button")
    page.locator(f"#detail a[data-batch='{bid}']").click()
    expect(page.locator("#detail-of")).to_contain_text("finished")
    expect(page.locator("#batch")).to_contain_text("1 succeeded")
    page.fill("#search-id", bid)                 # the search finds a batch by its id too
    page.click("#search button")
    expect(page.locator("#detail-of")).to_contain_text(f"batch {bid}")
    assert not ui.errors


@needs_browser
def test_cancel_retry_now_and_dead_letter_from_the_browser(cluster, api, ui):
    q = qname()
    ids = enqueue(api, q, 3, payload=b"{}")
    page = ui.open(leader_url(cluster))
    page.select_option("#jb-queue", q)
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(3)
    expect(page.locator("#jb-cancel")).to_be_disabled()               # nothing selected yet
    select_rows(page, "jobs", ids[:2])
    expect(page.locator("#jb-cancel")).to_have_text("Cancel selected (2)")
    expect(page.locator("#jb-retry")).to_be_disabled()                # ready jobs are not in flight
    page.click("#jb-cancel")
    expect(ui.msg()).to_have_text("cancelled 2 job(s)")
    assert [job_state(api, j) for j in ids] == [404, 404, "ready"]
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(1)
    assert any("Cancel 2 job(s)" in d for d in ui.dialogs)
    # in flight: retry now (a nack for its attempt, no delay) and dead-letter
    extra = enqueue(api, q, 1, max_attempts=1)
    flying = {j["id"]: j for j in reserve_all(api, q)}
    assert set(flying) == {ids[2], extra[0]}
    page.click("#jb-states button[data-state=in_flight]")
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(2)
    expect(page.locator("#jb-cancel")).to_be_disabled()
    select_rows(page, "jobs", [ids[2]])
    page.click("#jb-retry")
    expect(ui.msg()).to_have_text("retried 1 job(s)")
    status, job = api.get(f"/v1/jobs/{ids[2]}")
    assert job["state"] == "ready" and job["attempt"] == 2 and job["last_reason"] == "retried now from the admin UI"
    # retry now on the last attempt says so first, and dead-letters it (attempts_exhausted)
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(1)
    select_rows(page, "jobs", extra)
    page.click("#jb-retry")
    expect(ui.msg()).to_contain_text("on their last attempt: dead-lettered")
    assert any("last attempt" in d for d in ui.dialogs)
    status, recs = api.get(f"/v1/dead-letters?queue={q}")
    assert [(r["job"]["id"], r["cause"]) for r in recs["records"]] == [(extra[0], "attempts_exhausted")]
    # dead-letter from the job panel
    [again] = reserve_all(api, q)
    assert again["id"] == ids[2]
    page.fill("#search-id", ids[2])
    page.click("#search button")
    expect(page.locator("#detail")).to_contain_text("in_flight")
    page.click("#detail button[data-do=dead]")
    expect(ui.msg()).to_have_text("dead-lettered 1 job(s)")
    assert job_state(api, ids[2]) == "dead_lettered"
    expect(page.locator("#detail button[data-do=requeue]")).to_be_visible()   # the panel follows the job
    expect(page.locator(f"#dlq tr[data-id='{ids[2]}'] td").nth(4)).to_have_text("rejected")
    # in flight: delete it (docs/semantics.md "Cancel of a running job"): gone for good, its
    # worker's ack refused
    [running] = enqueue(api, q, 1)
    [held] = reserve_all(api, q)
    assert held["id"] == running
    page.click("#jb-states button[data-state=in_flight]")
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(1)
    select_rows(page, "jobs", [running])
    expect(page.locator("#jb-cancel")).to_have_text("Delete selected (1)")
    page.click("#jb-cancel")
    expect(ui.msg()).to_have_text("cancelled 1 job(s)")
    assert any("1 of them running" in d for d in ui.dialogs)
    assert job_state(api, running) == 404
    status, body = api.post(f"/v1/jobs/{running}/ack", {"attempt": held["attempt"]})
    assert status == 404 and body["error"]["code"] == "job_not_found"


@needs_browser
def test_enqueue_a_test_job_and_pause_and_resume(cluster, api, ui):
    q = qname()
    enqueue(api, q, 1)
    page = ui.open(leader_url(cluster))
    page.click("#enqueue-box summary")
    page.fill("#enq-queue", q)
    page.fill("#enq-type", "smoke")
    page.fill("#enq-priority", "7")
    page.fill("#enq-payload", '{"ping": true')                        # not JSON: refused in the page
    page.click("#enq-submit")
    expect(ui.msg()).to_contain_text("the payload is not JSON")
    page.fill("#enq-payload", '{"ping": true}')
    page.click("#enq-submit")
    expect(ui.msg()).to_contain_text(f"enqueued ")
    jid = ui.msg().inner_text().split()[1]
    status, job = api.get(f"/v1/jobs/{jid}")
    assert status == 200 and job["queue"] == q and job["job_type"] == "smoke" and job["priority"] == 7
    assert base64.b64decode(job["payload"]["data_b64"]) == b'{"ping": true}'
    expect(page.locator("#payload")).to_have_text('{\n  "ping": true\n}')   # shown at once
    # binary, typed as hex
    page.select_option("#enq-encoding", "application/octet-stream")
    page.fill("#enq-payload", "00 ff 10")
    page.fill("#enq-priority", "")
    page.click("#enq-submit")
    expect(ui.msg()).not_to_contain_text(jid)                     # the first enqueue's line is gone
    expect(ui.msg()).to_contain_text("enqueued ")
    jid = ui.msg().inner_text().split()[1]
    assert base64.b64decode(api.get(f"/v1/jobs/{jid}")[1]["payload"]["data_b64"]) == b"\x00\xff\x10"
    expect(page.locator(f"#queues tr[data-queue='{q}'] td").nth(1)).to_have_text("3")
    # pause, then resume
    page.locator(f"#queues button[data-pause='{q}']").click()
    expect(page.locator(f"#queues tr[data-queue='{q}'] .badge.paused")).to_be_visible()
    assert api.get(f"/v1/queues/{q}")[1]["paused"] is True
    assert reserve_all(api, q) == []                                  # reserve skips it
    page.locator(f"#queues button[data-pause='{q}']").click()
    expect(page.locator(f"#queues tr[data-queue='{q}'] .badge.paused")).to_have_count(0)
    assert api.get(f"/v1/queues/{q}")[1]["paused"] is False


@needs_browser
def test_dead_letters_by_queue_and_cause_refresh_requeue_and_delete(cluster, api, ui):
    qa, qb = qname(), qname()
    a_rej = [dead_letter(api, qa, "rejected", f"bad row {i}") for i in range(3)]
    a_ex = [dead_letter(api, qa, "attempts_exhausted") for _ in range(2)]
    b_rej = [dead_letter(api, qb, "rejected") for _ in range(2)]
    page = ui.open(leader_url(cluster))
    rows = page.locator("#dlq tbody tr[data-id]")
    # the queue row's dead-letter count opens the table on that queue
    page.locator(f"#queues a[data-dlq='{qa}']").click()
    expect(rows).to_have_count(5)
    expect(page.locator("#dl-count")).to_contain_text(f"5 kept in {qa}")
    page.select_option("#dl-cause", "rejected")
    expect(rows).to_have_count(3)
    expect(page.locator("#dlq tbody td:nth-child(5)")).to_have_text(["rejected"] * 3)
    expect(page.locator("#dlq tbody td:nth-child(6)").first).to_have_text("bad row 0")
    expect(page.locator("#dl-filters")).to_have_text(f"showing rejected in queue {qa}")
    # the table refreshes by itself: a new dead letter appears without touching the page
    a_rej.append(dead_letter(api, qa, "rejected"))
    expect(rows).to_have_count(4)
    # the filters clear
    page.click("#dl-clear")
    expect(page.locator("#dl-queue")).to_have_value("")
    expect(page.locator("#dl-cause")).to_have_value("")
    expect(page.locator("#dl-clear")).to_be_disabled()
    for jid in a_rej + a_ex + b_rej:
        expect(page.locator(f"#dlq tr[data-id='{jid}']")).to_have_count(1)
    # requeue / delete selected: disabled with nothing selected, then only the selected ones
    expect(page.locator("#dl-requeue")).to_be_disabled()
    expect(page.locator("#dl-delete")).to_be_disabled()
    select_rows(page, "dlq", [b_rej[0]])
    page.click("#dl-requeue")
    expect(ui.msg()).to_have_text("requeued 1")
    assert job_state(api, b_rej[0]) == "ready"
    select_rows(page, "dlq", [b_rej[1]])
    page.click("#dl-delete")
    expect(ui.msg()).to_have_text("deleted 1")
    assert job_state(api, b_rej[1]) == 404
    expect(page.locator(f"#dlq tr[data-id='{b_rej[1]}']")).to_have_count(0)
    # requeue all shown by the filters: only qa's rejected ones
    page.select_option("#dl-queue", qa)
    page.select_option("#dl-cause", "rejected")
    expect(rows).to_have_count(4)
    page.click("#dl-requeue-all")
    expect(ui.msg()).to_have_text(f"requeued 4 rejected dead letters of {qa}")
    assert [job_state(api, j) for j in a_rej] == ["ready"] * 4
    assert [job_state(api, j) for j in a_ex] == ["dead_lettered"] * 2
    expect(rows).to_have_count(0)
    # delete all shown: qa's, of every cause
    page.click("#dl-clear")
    page.select_option("#dl-queue", qa)
    expect(rows).to_have_count(2)
    page.click("#dl-delete-all")
    expect(ui.msg()).to_have_text(f"deleted 2 dead letters of {qa}")
    assert [job_state(api, j) for j in a_ex] == [404, 404]
    expect(page.locator("#dlq tbody tr.empty")).to_contain_text("no dead letters match the filters")
    assert api.get(f"/v1/dead-letters?queue={qa}")[1]["records"] == []


@needs_browser
def test_dead_letter_ready_and_scheduled_jobs_from_the_browser_with_a_reason(cluster, api, ui):
    q = qname()
    [flying] = enqueue(api, q, 1)
    assert [j["id"] for j in reserve_all(api, q)] == [flying]
    ready = enqueue(api, q, 2)
    later = enqueue(api, q, 2, delay_ms=3_600_000)
    path = f"/v1/queues/{q}/dead-letter"
    page = ui.open(leader_url(cluster))
    page.select_option("#jb-queue", q)
    rows = page.locator("#jobs tbody tr[data-id]")
    expect(rows).to_have_count(2)
    expect(page.locator("#jb-dead")).to_be_disabled()                 # nothing selected yet
    select_rows(page, "jobs", [ready[0]])
    expect(page.locator("#jb-dead")).to_have_text("Dead-letter selected (1)")
    expect(page.locator("#jb-dead")).to_be_enabled()                  # ready jobs too, now
    expect(page.locator("#jb-retry")).to_be_disabled()                # still in-flight only
    # dismissed at the confirmation, then at the reason: nothing is sent, the row stays selected
    ui.answers = [False]
    page.click("#jb-dead")
    ui.wait_dialogs(1)
    assert ui.dialogs[0].startswith(f"Dead-letter 1 ready job(s) of {q}? No worker gets them") and "cause admin" in ui.dialogs[0]
    ui.answers = [True, False]
    page.click("#jb-dead")
    ui.wait_dialogs(3)
    assert ui.dialogs[2].startswith("Reason")
    assert job_state(api, ready[0]) == "ready"
    expect(page.locator(f"#jobs tbody input[value='{ready[0]}']")).to_be_checked()
    # accepted, with a reason typed in
    ui.answers = [True, "bad batch 7"]
    page.click("#jb-dead")
    expect(ui.msg()).to_have_text(MOVED.format(1, 0))
    assert ui.calls("POST", path) == [{"ids": [ready[0]], "reason": "bad batch 7"}]   # the dismissed ones sent nothing
    assert job_state(api, ready[0]) == "dead_lettered"
    expect(rows).to_have_count(1)
    # scheduled jobs, the reason as offered
    page.click("#jb-states button[data-state=scheduled]")
    expect(rows).to_have_count(2)
    select_rows(page, "jobs", later)
    page.click("#jb-dead")
    expect(ui.msg()).to_have_text(MOVED.format(2, 0))
    assert ui.dialogs[-2].startswith(f"Dead-letter 2 scheduled job(s) of {q}?")
    assert sorted(ui.calls("POST", path)[-1]["ids"]) == sorted(later)
    expect(rows).to_have_count(0)
    # from the job panel, for a job reserved since the panel showed it ready: missing, left alone
    page.fill("#search-id", ready[1])
    page.click("#search button")
    expect(page.locator("#detail-of")).to_contain_text("ready")
    [got] = reserve_all(api, q)
    assert got["id"] == ready[1]
    page.click("#detail button[data-do=dead]")
    expect(ui.msg()).to_have_text(MOVED.format(0, 1))
    assert job_state(api, ready[1]) == "in_flight" and job_state(api, flying) == "in_flight"
    expect(page.locator("#detail-of")).to_contain_text("in flight")   # the panel follows the job
    # the dead letters: cause admin, the reasons kept
    status, out = api.get(f"/v1/dead-letters?queue={q}")
    assert status == 200
    assert {r["job"]["id"]: (r["cause"], r["last_reason"]) for r in out["records"]} == {
        ready[0]: ("admin", "bad batch 7"), later[0]: ("admin", "dead-lettered from the admin UI"),
        later[1]: ("admin", "dead-lettered from the admin UI")}
    page.select_option("#dl-queue", q)
    page.select_option("#dl-cause", "admin")
    expect(page.locator("#dlq tbody tr[data-id]")).to_have_count(3)
    expect(page.locator("#dlq tbody td:nth-child(5)")).to_have_text(["admin"] * 3)
    expect(page.locator(f"#dlq tr[data-id='{ready[0]}'] td").nth(5)).to_have_text("bad batch 7")


@needs_browser
def test_purge_a_queue_from_the_browser_leaves_its_in_flight_jobs(cluster, api, ui):
    q = qname()
    [flying] = enqueue(api, q, 1)
    [job] = reserve_all(api, q)
    waiting = enqueue(api, q, 3) + enqueue(api, q, 2, delay_ms=3_600_000)
    path = f"/v1/queues/{q}/purge"
    page = ui.open(leader_url(cluster))
    row = page.locator(f"#queues tr[data-queue='{q}'] td")
    expect(row.nth(1)).to_have_text("3")
    expect(row.nth(2)).to_have_text("2")
    expect(row.nth(3)).to_have_text("1")
    purge = page.locator(f"#queues button[data-purge='{q}']")
    # dismissed: nothing sent
    ui.answers = [False]
    purge.click()
    ui.wait_dialogs(1)
    assert ui.dialogs[0].startswith(f"Purge queue {q}? This removes its 5 ready and scheduled job(s) (3 ready, 2 scheduled)")
    assert "its 1 in-flight job(s) finish normally" in ui.dialogs[0]
    assert api.get(f"/v1/queues/{q}")[1]["ready"] == 3
    # accepted
    with page.expect_response(lambda r: urlsplit(r.url).path == path) as answer:
        purge.click()
    assert answer.value.status == 200 and answer.value.json() == {"queue": q, "purged": 5}
    expect(ui.msg()).to_have_text(f"purged 5 job(s) of {q}")
    assert len(ui.calls("POST", path)) == 1                           # the dismissed one sent nothing
    assert [job_state(api, j) for j in waiting] == [404] * 5
    status, info = api.get(f"/v1/queues/{q}")
    assert (info["ready"], info["scheduled"], info["in_flight"]) == (0, 0, 1)
    assert job_state(api, flying) == "in_flight"
    assert api.post(f"/v1/jobs/{flying}/ack", {"attempt": job["attempt"]})[0] == 200   # its worker finishes it
    expect(row.nth(1)).to_have_text("0")
    expect(row.nth(2)).to_have_text("0")
    # the audit tab, without keys: who is a dash
    page.click("#tabs button[data-tab=audit]")
    expect(page.locator("#view-main")).to_be_hidden()
    expect(page.locator("#tabs button[data-tab=audit]")).to_have_attribute("aria-pressed", "true")
    first = page.locator("#audit tbody tr").first.locator("td")
    expect(first.nth(2)).to_have_text("purge")
    expect(first.nth(3)).to_have_text(q)
    expect(first.nth(1)).to_have_text("—")
    expect(first.nth(4)).to_have_text('{"purged":5}')
    page.click("#tabs button[data-tab=main]")
    expect(page.locator("#view-audit")).to_be_hidden()
    expect(row.nth(3)).to_have_text("0")                              # the ack, shown


@needs_browser
def test_delete_a_queue_from_the_browser_only_when_empty_and_undeclared(cluster, api, ui):
    empty, full = qname(), qname()
    [jid] = enqueue(api, empty, 1)
    [job] = reserve_all(api, empty)
    assert api.post(f"/v1/jobs/{jid}/ack", {"attempt": job["attempt"]})[0] == 200
    enqueue(api, full, 2)
    page = ui.open(leader_url(cluster))
    page.select_option("#jb-queue", empty)                            # the job browser shows the queue that goes
    # a queue with jobs, and a declared one: refused, and the node's reason shown
    page.locator(f"#queues button[data-delqueue='{full}']").click()
    expect(ui.msg()).to_have_text(f"delete queue {full}: queue '{full}' is not empty (2 ready): only a queue with "
                                  "no job in any state can be deleted (409 failed_precondition)")
    assert ui.msg().get_attribute("class") == "bad"
    assert api.get(f"/v1/queues/{full}")[1]["ready"] == 2
    page.locator(f"#queues button[data-delqueue='{DECLARED}']").click()
    expect(ui.msg()).to_have_text(f"delete queue {DECLARED}: queue '{DECLARED}' is declared in the configuration: "
                                  "remove its [[queues]] entry first (409 failed_precondition)")
    assert api.get(f"/v1/queues/{DECLARED}")[0] == 200
    # dismissed: nothing sent
    delete = page.locator(f"#queues button[data-delqueue='{empty}']")
    n = len(ui.dialogs)
    ui.answers = [False]
    delete.click()
    ui.wait_dialogs(n + 1)
    assert ui.dialogs[-1].startswith(f"Delete queue {empty}?")
    # accepted: gone from the node and from the page, which stays fresh
    delete.click()
    expect(ui.msg()).to_have_text(f"deleted queue {empty}")
    assert len(ui.calls("DELETE", f"/v1/queues/{empty}")) == 1
    assert empty not in [x["name"] for x in api.get("/v1/queues")[1]["queues"]]
    assert api.get(f"/v1/queues/{empty}")[1]["enqueued"] == 0             # its counters went with it
    expect(page.locator(f"#queues tr[data-queue='{empty}']")).to_have_count(0)
    expect(page.locator("#jb-queue")).not_to_have_value(empty)
    before = page.locator("#updated").inner_text()
    poll(lambda: page.locator("#updated").inner_text() != before, timeout=20, what="a later refresh")
    expect(page.locator("body")).to_have_attribute("data-stale", "false")


@needs_browser
@needs_browser
def test_api_keys_are_asked_for_kept_in_the_tab_and_sent_and_the_dead_letter_store_off_is_told(
        auth_cluster, ui, browser):
    api = Api(auth_cluster)
    q = qname()
    enqueue(api, q, 2, headers=bearer("operator"))
    url = leader_url(auth_cluster)
    page = ui.page
    page.goto(url + "/")
    expect(page.locator("#authn")).to_contain_text("This cluster needs an API key")
    expect(page.locator("#here")).to_contain_text("needs a key")
    page.fill("#key", KEYS["viewer"])
    page.click("#key-use")
    ui.wait_fresh()
    expect(page.locator("#authn")).to_be_hidden()
    expect(page.locator("#key-state")).to_have_text("key set (this tab only)")
    expect(page.locator(f"#queues tr[data-queue='{q}'] td").nth(1)).to_have_text("2")
    assert f"Bearer {KEYS['viewer']}" in ui.auth_headers
    # this cluster keeps no dead letters: the page says so instead of an always-empty table
    expect(page.locator("#dl-off")).to_be_visible()
    expect(page.locator("#dl-on")).to_be_hidden()
    # a viewer may not pause: the page says which role it takes, and nothing changes
    page.locator(f"#queues button[data-pause='{q}']").click()
    expect(ui.msg()).to_have_text(f"pause {q}: the key's role is viewer; this needs operator or higher")
    assert api.get(f"/v1/queues/{q}", headers=bearer("viewer"))[1]["paused"] is False
    # a viewer reads the schedules, and may not trigger one
    sched = "ui-keys-" + uuid.uuid4().hex[:6]
    status, out = api.call("PUT", f"/v1/schedules/{sched}", {"cron": "@yearly", "job": {"queue": q, "job_type": "t"}},
                           headers=bearer("operator"))
    assert status == 200, out
    schedule_row(page, sched).locator("button[data-strigger]").click()
    expect(ui.msg()).to_have_text(f"trigger schedule {sched}: the key's role is viewer; this needs operator or higher")
    assert api.get(f"/v1/queues/{q}", headers=bearer("viewer"))[1]["ready"] == 2
    # the key lives in this tab: a reload keeps it; another key replaces it
    page.reload()
    ui.wait_fresh()
    page.fill("#key", KEYS["operator"])
    page.click("#key-use")
    ui.wait_fresh()
    page.locator(f"#queues button[data-pause='{q}']").click()
    expect(page.locator(f"#queues tr[data-queue='{q}'] .badge.paused")).to_be_visible()
    assert api.get(f"/v1/queues/{q}", headers=bearer("viewer"))[1]["paused"] is True
    # a wrong key is refused and said so
    page.fill("#key", "not-a-key")
    page.click("#key-use")
    expect(page.locator("#authn")).to_contain_text("The node refused this key")
    page.click("#key-forget")
    expect(page.locator("#authn")).to_contain_text("This cluster needs an API key")
    # another tab starts without a key
    other = UI(browser)
    try:
        other.page.goto(url + "/")
        expect(other.page.locator("#authn")).to_contain_text("needs an API key")
    finally:
        other.context.close()


@needs_browser
def test_audit_tab_names_the_key_pages_older_entries_and_tells_a_viewer_it_may_not(auth_cluster, ui):
    api = Api(auth_cluster)
    op = bearer("operator")
    q, other = qname(), qname()
    ids = enqueue(api, q, 3, headers=op)
    enqueue(api, other, 1, headers=op)
    for _ in range(30):                       # older entries, more than a page
        for verb in ("pause", "resume"):
            assert api.post(f"/v1/queues/{other}/{verb}", headers=op)[0] == 200
    page = ui.page
    page.goto(leader_url(auth_cluster) + "/")
    page.fill("#key", KEYS["operator"])
    page.click("#key-use")
    ui.wait_fresh()
    # dead-letter one job and purge the rest with an operator key
    page.select_option("#jb-queue", q)
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(3)
    select_rows(page, "jobs", [ids[0]])
    ui.answers = [True, "operator says no"]
    page.click("#jb-dead")
    expect(ui.msg()).to_have_text(MOVED.format(1, 0))
    assert "this cluster keeps no dead letters, so they are dropped at once" in ui.dialogs[-2]
    assert job_state(api, ids[0], headers=op) == 404                 # retention 0: dropped
    page.locator(f"#queues button[data-purge='{q}']").click()
    expect(ui.msg()).to_have_text(f"purged 2 job(s) of {q}")
    # deleting a queue takes an admin key
    page.locator(f"#queues button[data-delqueue='{q}']").click()
    expect(ui.msg()).to_have_text(f"delete queue {q}: the key's role is operator; this needs admin or higher")
    assert api.get(f"/v1/queues/{q}", headers=op)[0] == 200
    # the audit tab: newest first, who by key name
    page.click("#tabs button[data-tab=audit]")
    rows = page.locator("#audit tbody tr")
    expect(rows).to_have_count(50)
    status, newest = api.get("/v1/audit?limit=50", headers=op)
    assert status == 200 and newest["next_cursor"]
    top = newest["entries"][:2]
    assert [(e["action"], e["target"], e["who"]) for e in top] == [
        ("purge", q, "operator-app"), ("dead_letter_move", q, "operator-app")]
    first, second = rows.nth(0).locator("td"), rows.nth(1).locator("td")
    expect(first.nth(1)).to_have_text("operator-app")
    expect(first.nth(2)).to_have_text("purge")
    expect(first.nth(3)).to_have_text(q)
    expect(first.nth(4)).to_have_text(compact({"purged": 2}))
    expect(second.nth(1)).to_have_text("operator-app")
    expect(second.nth(2)).to_have_text("dead_letter_move")
    expect(second.nth(4)).to_have_text(compact(top[1]["details"]))
    assert top[1]["details"]["reason"] == "operator says no" and top[1]["details"]["ids"] == [ids[0]]
    # at_ms in local time, the exact instant in the tooltip
    at = top[0]["at_ms"]
    expect(first.nth(0).locator("span").first).to_have_attribute("title", iso_utc(at))
    expect(first.nth(0)).to_contain_text(datetime.fromtimestamp(at // 1000).strftime("%Y-%m-%d %H:%M:%S"))
    # older: the next page by next_cursor, and back
    expect(page.locator("#au-prev")).to_be_disabled()
    page.click("#au-next")
    expect(page.locator("#au-page")).to_have_text("page 2")
    status, older = api.get(f"/v1/audit?limit=50&cursor={newest['next_cursor']}", headers=op)
    expect(page.locator("#audit tbody td:nth-child(3)")).to_have_text([e["action"] for e in older["entries"]])
    expect(page.locator("#audit tbody td:nth-child(4)")).to_have_text([e["target"] or "—" for e in older["entries"]])
    page.click("#au-prev")
    expect(page.locator("#au-page")).to_have_text("page 1")
    expect(first.nth(2)).to_have_text("purge")
    # shown again, it reads the newest entries (from an older page too)
    page.click("#au-next")
    expect(page.locator("#au-page")).to_have_text("page 2")
    page.click("#tabs button[data-tab=main]")
    assert api.post(f"/v1/queues/{other}/pause", headers=op)[0] == 200
    page.click("#tabs button[data-tab=audit]")
    expect(page.locator("#au-page")).to_have_text("page 1")
    expect(first.nth(2)).to_have_text("pause")
    expect(first.nth(3)).to_have_text(other)
    # a viewer key: the permission message, no table
    page.fill("#key", KEYS["viewer"])
    page.click("#key-use")
    ui.wait_fresh()
    expect(page.locator("#au-denied")).to_have_text("the audit trail: the key's role is viewer; this needs operator or higher")
    expect(page.locator("#audit")).to_be_hidden()
    page.click("#tabs button[data-tab=main]")
    page.click("#tabs button[data-tab=audit]")
    expect(page.locator("#au-denied")).to_be_visible()
    expect(page.locator("#audit")).to_be_hidden()
    # an admin key deletes the queue (empty now), and the trail names it
    page.fill("#key", KEYS["admin"])
    page.click("#key-use")
    ui.wait_fresh()
    expect(page.locator("#au-denied")).to_be_hidden()
    expect(page.locator("#audit")).to_be_visible()
    page.click("#tabs button[data-tab=main]")
    page.locator(f"#queues button[data-delqueue='{q}']").click()
    expect(ui.msg()).to_have_text(f"deleted queue {q}")
    page.click("#tabs button[data-tab=audit]")
    expect(first.nth(2)).to_have_text("queue_delete")
    expect(first.nth(1)).to_have_text("admin-app")
    expect(first.nth(3)).to_have_text(q)


@needs_browser
def test_leader_killed_under_an_open_page_marks_it_stale_then_moves_it_to_a_live_node(fresh_cluster, ui):
    c = fresh_cluster(durability="memory", api_keys=API_KEYS, storage=RETENTION)
    api = Api(c)
    q = qname()
    enqueue(api, q, 5, headers=bearer("operator"))
    lead = c.wait_leader(20)
    page = ui.page
    page.goto(c.urls[lead] + "/")
    page.fill("#key", KEYS["operator"])
    page.click("#key-use")
    ui.wait_fresh()
    page.select_option("#jb-queue", q)
    page.select_option("#dl-cause", "expired")
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(5)
    # Keep the page from finding another node at first, to see it mark its data stale.
    others = [c.urls[i] + "/healthz" for i in range(c.n) if i != lead]
    for u in others:
        page.route(u, lambda route: route.abort())
    c.kill(lead)
    expect(page.locator("body")).to_have_attribute("data-stale", "true")
    expect(page.locator("#stale")).to_contain_text(f"node {c.ids[lead]} ({c.urls[lead]}) does not answer")
    expect(page.locator("#stale")).to_contain_text("The data below is from")
    expect(page.locator(f"#queues tr[data-queue='{q}'] td").nth(1)).to_have_text("5")   # kept, greyed
    for u in others:
        page.unroute(u)
    # now it moves to a node that answers, and once a new leader is elected shows fresh data there
    expect(page).not_to_have_url(re.compile(re.escape(c.urls[lead])), timeout=30_000)
    expect(page.locator("body")).to_have_attribute("data-stale", "false", timeout=30_000)
    expect(page.locator("#here .badge")).to_have_text("leader")
    new = next(i for i in range(c.n) if page.url.startswith(c.urls[i]))
    assert new != lead and c.wait_leader(20, exclude=lead) == new
    expect(page.locator("#moved")).to_contain_text(f"node {c.ids[lead]} ({c.urls[lead]}) does not answer")
    expect(page.locator(f"#nodes tr[data-node='{c.ids[lead]}'] .badge")).to_have_text("down")
    expect(page.locator(f"#nodes tr[data-node='{c.ids[lead]}']")).to_contain_text("connection refused")
    # the key and the panel choices came along; the key is not left in the address bar
    expect(page.locator("#key-state")).to_have_text("key set (this tab only)")
    assert "key=" not in page.url
    expect(page.locator("#jb-queue")).to_have_value(q)
    expect(page.locator("#dl-cause")).to_have_value("expired")
    expect(page.locator("#jobs tbody tr[data-id]")).to_have_count(5)
    # and the nodes' logs name Raft roles, not the Raft layer's numbers
    log = c.log_path(new).read_text()
    assert re.search(r"raft role (follower|candidate) -> leader", log), log[-2000:]
    assert "raft state" not in log


# ------------------------------------------------------------------------------ schedules
def schedule_row(page, name):
    return page.locator(f"#schedules tr[data-schedule='{name}']")


@needs_browser
def test_schedules_panel_creates_lists_fires_pauses_triggers_and_deletes(cluster, api, ui):
    """A schedule made through the form (every 1000 ms) fires while the page watches; pause,
    trigger (the job id it made) and delete with its version: a version changed behind the page's
    back is refused (409, the status line says so), the next reading's is not. The job type is
    markup, shown as text."""
    q, name = qname(), "ui-every-" + uuid.uuid4().hex[:6]
    job_type = '<img src=x onerror="window.__xss = 1">tick'
    page = ui.open(leader_url(cluster))
    page.click("#schedule-box summary")
    page.fill("#sch-name", name)
    page.fill("#sch-every", "1000")
    page.fill("#sch-queue", q)
    page.fill("#sch-type", job_type)
    page.select_option("#sch-catchup", "skip")
    page.select_option("#sch-overlap", "allow")
    page.click("#sch-submit")
    expect(ui.msg()).to_contain_text(f"created schedule {name}")
    [put] = ui.calls("PUT", f"/v1/schedules/{name}")
    assert put == {"every_ms": 1000, "catchup": "skip", "overlap": "allow", "expect_version": 0,
                   "job": {"queue": q, "job_type": job_type}}                  # no time zone with an interval
    row = schedule_row(page, name)
    cells = row.locator("td")
    expect(cells.nth(1)).to_contain_text("every 1,000 ms")
    expect(cells.nth(1)).to_contain_text("catch-up skip · overlap allow")
    expect(cells.nth(2)).to_have_text(f"{q} / {job_type}")                    # markup shown as text
    assert row.locator("img").count() == 0 and page.evaluate("window.__xss") is None
    expect(cells.nth(8)).to_have_text("active")
    expect(cells.nth(3)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \((in \d+s|\d+s ago)\)$"))
    # it fires: fired grows by itself, the last tick and its job show
    expect(cells.nth(6)).to_have_text(re.compile(r"^[1-9]"))
    first = int(cells.nth(6).inner_text())
    poll(lambda: int(cells.nth(6).inner_text()) > first, timeout=20, what="fired growing")
    expect(cells.nth(4)).to_contain_text(re.compile(r"\(\d+s ago\)"))
    expect(cells.nth(5).locator("a")).to_have_text(re.compile(r"^(ready|finished)$"))
    status, view = api.get(f"/v1/schedules/{name}")
    assert status == 200 and view["fired"] >= 2 and view["job"]["job_type"] == job_type
    # pause: paused on the node and on the page, nothing due
    row.locator("button[data-spause]").click()
    expect(ui.msg()).to_have_text(f"paused schedule {name}")
    expect(cells.nth(8)).to_have_text("paused")
    expect(cells.nth(3)).to_have_text("paused")
    expect(row.locator("button[data-spause]")).to_have_text("Resume")
    status, view = api.get(f"/v1/schedules/{name}")
    assert view["paused"] is True and view["next_fire_at_ms"] is None and view["version"] == 2
    # trigger: one job now, its id in the status line and in the job panel
    row.locator("button[data-strigger]").click()
    expect(ui.msg()).to_contain_text(f"triggered schedule {name}: job ")
    jid = ui.msg().inner_text().rsplit(" ", 1)[1]
    assert uuid.UUID(jid) and job_state(api, jid) == "ready"
    expect(page.locator("#detail-of")).to_contain_text(jid)
    # delete, while someone resumes it behind the page's back: 409, nothing deleted
    deleting = lambda r: r.method == "DELETE" and urlsplit(r.url).path == f"/v1/schedules/{name}"
    ui.answers = [lambda: api.post(f"/v1/schedules/{name}/resume")[0] == 200]
    with page.expect_request(deleting) as sent:
        row.locator("button[data-sdelete]").click()
    assert parse_qs(urlsplit(sent.value.url).query) == {"expect_version": ["2"]}
    expect(ui.msg()).to_contain_text(f"delete schedule {name}: expect_version 2 is not schedule '{name}''s version (3)")
    expect(ui.msg()).to_contain_text("(409 failed_precondition)")
    assert ui.msg().get_attribute("class") == "bad"
    assert ui.dialogs[-1].startswith(f"Delete schedule {name} (version 2)?")
    assert api.get(f"/v1/schedules/{name}")[0] == 200
    # the reading after shows version 3 (active again): that one is deleted
    expect(cells.nth(8)).to_have_text("active")
    with page.expect_request(deleting) as sent:
        row.locator("button[data-sdelete]").click()
    assert parse_qs(urlsplit(sent.value.url).query) == {"expect_version": ["3"]}
    expect(ui.msg()).to_have_text(f"deleted schedule {name}")
    assert ui.dialogs[-1].startswith(f"Delete schedule {name} (version 3)?")
    assert api.get(f"/v1/schedules/{name}")[0] == 404
    expect(row).to_have_count(0)
    assert job_state(api, jid) == "ready"                                      # its jobs stay


@needs_browser
def test_schedule_form_shows_the_field_a_400_names_and_creates_nothing(cluster, api, ui):
    name = "ui-bad-" + uuid.uuid4().hex[:6]
    page = ui.open(leader_url(cluster))
    page.click("#schedule-box summary")
    page.fill("#sch-name", name)
    page.fill("#sch-cron", "0 25 * * *")
    page.fill("#sch-zone", "Europe/Berlin")
    page.fill("#sch-queue", qname())
    page.click("#sch-submit")
    expect(page.locator("#sch-error")).to_have_text("cron: hour field '25' is out of range 0-23")
    expect(page.locator("#sch-error b")).to_have_text("cron")
    expect(page.locator("#sch-cron")).to_have_attribute("aria-invalid", "true")
    expect(ui.msg()).to_have_text(f"create schedule {name}: cron: hour field '25' is out of range 0-23 (400 invalid_argument)")
    assert ui.calls("PUT", f"/v1/schedules/{name}")[0]["time_zone"] == "Europe/Berlin"
    assert api.get(f"/v1/schedules/{name}")[0] == 404
    expect(schedule_row(page, name)).to_have_count(0)
    # an unknown zone names time_zone; fixed, it is created and the error goes
    page.fill("#sch-cron", "0 3 * * *")
    page.fill("#sch-zone", "Mars/Olympus")
    page.click("#sch-submit")
    expect(page.locator("#sch-error b")).to_have_text("time_zone")
    expect(page.locator("#sch-zone")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#sch-cron")).not_to_have_attribute("aria-invalid", "true")
    page.fill("#sch-zone", "Europe/Berlin")
    page.click("#sch-submit")
    expect(ui.msg()).to_contain_text(f"created schedule {name}")
    expect(page.locator("#sch-error")).to_be_hidden()
    expect(schedule_row(page, name).locator("td").nth(1)).to_contain_text("0 3 * * * (Europe/Berlin)")
    assert api.call("DELETE", f"/v1/schedules/{name}")[0] == 200


# ------------------------------------------------------------------------------ the routes it uses
def test_cluster_nodes_answers_every_members_view_and_says_why_one_is_missing(fresh_cluster):
    c = fresh_cluster(durability="memory", api_keys=API_KEYS)
    lead = c.wait_leader(20)
    status, out = http_json("GET", c.urls[lead] + "/v1/cluster/nodes", headers=bearer("viewer"))
    assert status == 200 and out["node_id"] == c.ids[lead]
    rows = {n["id"]: n for n in out["nodes"]}
    assert set(rows) == set(c.ids) and all(n["reachable"] and n["error"] is None for n in rows.values())
    assert rows[c.ids[lead]]["role"] == "leader" and all(n["lag"] >= 0 for n in rows.values())
    assert {n["peers"] for n in rows.values()} == {2}
    # the caller's key goes along: no key is 401 here before anything is asked of the others
    assert http_json("GET", c.urls[lead] + "/v1/cluster/nodes")[0] == 401
    # a member that is down: its row says so, the others still answer
    down = follower_index(c)
    c.kill(down)
    status, out = http_json("GET", c.urls[lead] + "/v1/cluster/nodes", headers=bearer("viewer"))
    rows = {n["id"]: n for n in out["nodes"]}
    assert rows[c.ids[down]] == {"id": c.ids[down], "url": c.urls[down], "reachable": False,
                                 "error": "connection refused"}
    assert rows[c.ids[lead]]["reachable"] and rows[c.ids[lead]]["peers_connected"] in (1, 2)
    # the admin page lets itself call only its node, plus a probe of the others' /healthz
    with urllib.request.urlopen(c.urls[lead] + "/", timeout=5) as r:
        csp = r.headers["Content-Security-Policy"]
    connect = next(d for d in csp.split(";") if d.strip().startswith("connect-src")).split()[1:]
    assert connect[0] == "'self'" and sorted(connect[1:]) == sorted(u for i, u in enumerate(c.urls) if i != lead)


@needs_browser
def test_expired_tab_expired_counts_and_the_no_workers_badge(fresh_cluster, ui):
    """A queue whose job passed its deadline: its expired count links to the Expired tab, the tab
    counts and lists it (and the record forwarded into the forward queue); the no-workers badge
    goes when a worker reserves and comes back a window (shortened to 6 s here: longer than the
    page's refresh period, so a reading falls inside it) later."""
    src, fwd = "ui-src-" + uuid.uuid4().hex[:6], "ui-fwd-" + uuid.uuid4().hex[:6]
    c = fresh_cluster(durability="memory", storage=RETENTION, testing={"workers_window_ms": 6000},
                      queues=[{"name": src, "dead_letter_forward": fwd}, {"name": fwd}])
    api = Api(c)
    lead = c.wait_leader(20)
    [late] = enqueue(api, src, deadline_at_ms=int(time.time() * 1000) + 300)
    poll(lambda: job_state(api, late) == "dead_lettered", timeout=20, what="the job past its deadline dead-lettered")
    failed = dead_letter(api, src, "rejected")
    quiet = "ui-quiet-" + uuid.uuid4().hex[:6]               # no job waits in it: idle, no badge
    enqueue(api, quiet, scheduled_at_ms=int(time.time() * 1000) + 3_600_000)
    page = ui.open(c.urls[lead])
    row = page.locator(f"#queues tr[data-queue='{src}']")
    expect(row.locator("td").nth(13)).to_have_text("1")                  # expired, total
    expect(row.locator(".badge.noworkers")).to_have_count(0)              # nothing ready: nobody is missing
    enqueue(api, src, n=2)
    expect(row.locator(".badge.noworkers")).to_have_text("no workers")
    expect(page.locator(f"#queues tr[data-queue='{quiet}'] td").nth(2)).to_have_text("1")   # scheduled
    expect(page.locator(f"#queues tr[data-queue='{quiet}'] .badge.noworkers")).to_have_count(0)
    # the Expired tab: its count, then only the expired dead letter
    tab = page.locator("#dl-tabs button[data-cause='expired']")
    expect(tab).to_have_text("Expired (1)")
    expect(page.locator("#dl-tabs button[data-cause='rejected']")).to_have_text("Rejected (1)")
    tab.click()
    expect(tab).to_have_attribute("aria-pressed", "true")
    rows = page.locator("#dlq tbody tr[data-id]")
    expect(rows).to_have_count(1)
    expect(page.locator(f"#dlq tr[data-id='{late}'] td").nth(4)).to_have_text("expired")
    expect(page.locator("#dl-cause")).to_have_value("expired")
    page.locator("#dl-tabs button[data-cause='']").click()
    expect(rows).to_have_count(2)
    expect(page.locator(f"#dlq tr[data-id='{failed}']")).to_have_count(1)
    # the queue row's expired count opens the Expired tab on that queue
    page.locator(f"#queues a[data-expired='{src}']").click()
    expect(tab).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#dl-queue")).to_have_value(src)
    expect(rows).to_have_count(1)
    # the forward queue holds the record job (it is a queue like any other in the table)
    expect(page.locator(f"#queues tr[data-queue='{fwd}'] td").nth(1)).to_have_text("1")
    # a worker reserves one of the two: the badge goes and the workers count says 1; a window
    # later, with a job still ready, it is back
    status, out = api.post("/v1/reserve", {"queues": [src], "lease_ms": 60_000, "worker_id": "w-ui"})
    assert status == 200, out
    expect(row.locator(".badge.noworkers")).to_have_count(0)
    expect(row.locator("td").nth(12)).to_have_text("1")                  # workers
    expect(row.locator(".badge.noworkers")).to_have_text("no workers")
    expect(row.locator("td").nth(12)).to_have_text("0")


@needs_browser
def test_circuit_window_and_throttle_badges_and_the_close_circuit_button(cluster, api, ui):
    """The gating fields (circuit, window_open, throttled) come from nodes with those features:
    here the page's GET /v1/queues answers are the cluster's with them added to one queue, and
    the close call is answered by the test. A queue without the fields shows none of it."""
    gated, plain, closed = qname(), qname(), qname()
    for q in (gated, plain, closed):
        enqueue(api, q)
    added = {gated: {"circuit": {"state": "open", "failures": 5, "opened_at_ms": 1_700_000_000_000,
                                 "open_until_ms": 4_102_444_800_000, "opened_total": 2},
                     "window_open": False, "throttled": 4, "throttle_deferred_total": 9},
             closed: {"circuit": {"state": "closed", "failures": 0, "opened_at_ms": None, "open_until_ms": None,
                                  "opened_total": 0}, "window_open": True, "throttled": 0}}
    closes = []

    def queues(route):
        if route.request.method != "GET":
            return route.continue_()
        resp = route.fetch()
        body = resp.json()
        for q in body["queues"]:
            q.update(added.get(q["name"], {}))
        route.fulfill(response=resp, json=body)

    def close(route):
        closes.append(route.request.url)
        added[gated]["circuit"] = {**added[gated]["circuit"], "state": "closed"}
        route.fulfill(status=200, json={"queue": gated, "circuit": added[gated]["circuit"]})

    ui.page.route(re.compile(r".*/v1/queues$"), queues)
    ui.page.route(re.compile(r".*/v1/queues/[^/]+/circuit/close$"), close)
    page = ui.open(leader_url(cluster))
    g = page.locator(f"#queues tr[data-queue='{gated}']")
    expect(g.locator(".badge.circuit")).to_have_text("circuit open")
    expect(g.locator(".badge.window")).to_have_text("window closed")
    expect(g.locator(".badge.throttled")).to_have_text("4 throttled")
    for other in (plain, closed):
        r = page.locator(f"#queues tr[data-queue='{other}']")
        expect(r.locator("td").nth(1)).to_have_text("1")
        expect(r.locator(".badge.circuit, .badge.window, .badge.throttled")).to_have_count(0)
        expect(r.locator("button[data-closecircuit]")).to_have_count(0)
    g.locator(f"button[data-closecircuit='{gated}']").click()
    expect(ui.msg()).to_have_text(f"closed the circuit of {gated}")
    assert len(closes) == 1 and closes[0].endswith(f"/v1/queues/{gated}/circuit/close")
    assert ui.calls("POST", f"/v1/queues/{gated}/circuit/close") == [None]
    expect(g.locator(".badge.circuit")).to_have_count(0)                # the next reading: closed
    expect(g.locator("button[data-closecircuit]")).to_have_count(0)


@needs_browser
def test_keys_panel_and_badge_of_a_queue_with_keys(cluster, api, ui):
    """A queue whose jobs have keys: its row's badge counts the ready jobs its keys' limits hold
    back; in the job browser the Keys panel gives its three counts and its top keys from GET
    /v1/queues/{name}/keys (ready, in flight, the limit that holds each, the limits in force, the
    weight), and follows the queue as it changes. A queue without keys shows no panel and the
    page does not ask for its keys."""
    q, plain = KEYED["name"], qname()
    for key in ("acme", "acme", "acme", "globex"):
        enqueue(api, q, key=key)
    enqueue(api, q)                                     # no key: never held
    enqueue(api, plain, 2)
    jobs = reserve_all(api, q)
    assert sorted(j.get("key", "-") for j in jobs) == ["-", "acme", "globex"]      # one per key: concurrency 1
    page = ui.open(leader_url(cluster))
    row = page.locator(f"#queues tr[data-queue='{q}']")
    expect(row.locator(".badge.keys")).to_have_text("2 held by keys")
    expect(row.locator(".badge.keys")).to_have_attribute("title", re.compile(r"\(2 of 2 keys at a limit\)"))
    expect(page.locator(f"#queues tr[data-queue='{plain}'] .badge.keys")).to_have_count(0)
    row.locator(f"a[data-browse='{q}']").click()
    expect(page.locator("#keys-box")).to_be_visible()
    expect(page.locator("#keys-sum")).to_have_text(
        f"{q}: 2 key(s) · 2 at a limit · 2 ready job(s) held by their key · by ready jobs")
    rows = page.locator("#keys tbody tr")
    expect(rows).to_have_count(2)
    acme, globex = rows.nth(0).locator("td"), rows.nth(1).locator("td")
    for cells, want in ((acme, ["acme", "2", "1", "at concurrency limit",
                                "concurrency 1 · rate 100 per 10m (1 in the window)", "2"]),
                        (globex, ["globex", "0", "1", "at concurrency limit",
                                  "concurrency 1 · rate 100 per 10m (1 in the window)", "1"])):
        for i, text in enumerate(want):
            expect(cells.nth(i)).to_have_text(text)
    assert any(re.search(rf"/v1/queues/{q}/keys\?limit=10$", u) for u in ui.listings), ui.listings
    # globex's job acked: its slot frees (no longer held); the key stays while its hand-out is
    # inside its rate window. The panel follows at the next reading.
    [g] = [j for j in jobs if j.get("key") == "globex"]
    assert api.post(f"/v1/jobs/{g['id']}/ack", {"attempt": g["attempt"]})[0] == 200
    expect(page.locator("#keys-sum")).to_have_text(re.compile(rf"^{q}: 2 key\(s\) · 1 at a limit · 2 ready"))
    expect(globex.nth(2)).to_have_text("0")
    expect(globex.nth(3)).to_have_text("")
    expect(globex.nth(4)).to_have_text("concurrency 1 · rate 100 per 10m (1 in the window)")
    expect(row.locator(".badge.keys")).to_have_attribute("title", re.compile(r"\(1 of 2 keys at a limit\)"))
    # A queue without keys: no panel, and its keys are never asked for.
    page.select_option("#jb-queue", plain)
    expect(page.locator("#jobs-of")).to_have_text(f"{plain}: 2 ready")
    expect(page.locator("#keys-box")).to_be_hidden()
    shown = page.locator("#updated").text_content()
    expect(page.locator("#updated")).not_to_have_text(shown)          # another reading went by
    expect(page.locator("#keys-box")).to_be_hidden()
    assert not any(f"/v1/queues/{plain}/keys" in u for u in ui.listings), ui.listings


def test_dead_letters_by_cause_pages_through_and_refuses_an_unknown_cause(cluster, api):
    q = qname()
    rejected = [dead_letter(api, q, "rejected") for _ in range(3)]
    exhausted = [dead_letter(api, q, "attempts_exhausted") for _ in range(2)]
    got, cursor = [], None
    while True:
        path = f"/v1/dead-letters?queue={q}&cause=rejected&limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, out = api.get(path)
        assert status == 200 and all(r["cause"] == "rejected" for r in out["records"])
        got += [r["job"]["id"] for r in out["records"]]
        cursor = out["next_cursor"]
        if cursor is None:
            break
    assert got == rejected
    status, out = api.get(f"/v1/dead-letters?queue={q}&cause=attempts_exhausted")
    assert [r["job"]["id"] for r in out["records"]] == exhausted
    for bad in ("nope", ""):
        status, out = api.get(f"/v1/dead-letters?cause={bad}")
        assert status == 400 and out["error"]["code"] == "invalid_argument" and "cause must be" in out["error"]["message"]
