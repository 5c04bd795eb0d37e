"""The app's turn flow without Qt: ConversationModel over a real chat store (in a temporary
folder), a fake engine that records requests, and fake views that record what they were told.
No QApplication; the same module is checked to import without PySide6."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from merlin.app.model import conversation as conv_mod
from merlin.app.model.conversation import COMMIT_S, ConversationModel
from merlin.app.model.jobs import ModelInfo, SessionReport
from merlin.app.model.perf_stats import PerfStats
from merlin.app.model.prompting import GenerationOptions
from merlin.app.model.store import Store
from merlin.engine.generate import Finished, PrefillDone, Tokens
from merlin.engine.profile import StepProfile
from merlin.engine.session import ContextTrimmed


class FakeEngine:
    def __init__(self):
        self.loads, self.jobs, self.prepared, self.forgotten, self.caps = [], [], [], [], []

    def load(self, request):
        self.loads.append(request)

    def generate(self, job):
        self.jobs.append(job)

    def prepare(self, job):
        self.prepared.append(job)

    def forget(self, conversation_id):
        self.forgotten.append(conversation_id)

    def set_session_cap(self, cap):
        self.caps.append(cap)


@dataclass
class FakeMessage:
    id: int
    role: str
    text: str
    state: str
    streamed: list = field(default_factory=list)
    finished: tuple | None = None
    notices: list = field(default_factory=list)
    versions: tuple = (1, 1)

    def set_versions(self, version, count):
        self.versions = (version, count)

    def stream(self, text):
        self.streamed.append(text)

    def finish(self, text, state, stats=None, error=""):
        self.finished = (text, state, stats, error)
        self.text, self.state = text, state

    def set_state(self, state, error=""):
        self.state = state

    def set_notices(self, notices):
        self.notices = list(notices)


class FakeView:
    def __init__(self):
        self.items: list[FakeMessage] = []
        self.busy = None

    def add_message(
        self, mid, role, text, paths=(), names=(), state="done", stats=None, error="", at_top=False
    ):
        m = FakeMessage(mid, role, text, state)
        self.items.insert(0, m) if at_top else self.items.append(m)
        return m

    def message(self, mid):
        return next((m for m in self.items if m.id == mid), None)

    def last_message_id(self):
        return self.items[-1].id if self.items else None

    def remove_from(self, mid):
        self.items = [m for m in self.items if m.id < mid]

    def clear(self):
        self.items = []

    def scroll_to_bottom(self):
        pass

    def set_more_above(self, more):
        self.more_above = more

    def update_actions(self, busy):
        self.busy = busy


class FakeComposer:
    def __init__(self):
        self.busy, self.notices, self.cleared, self.ended = False, [], 0, []

    def set_busy(self, busy):
        self.busy = busy

    def show_notice(self, text):
        self.notices.append(text)

    def end_edit(self, restore_draft):
        self.ended.append(restore_draft)

    def leave_edit(self):
        self.ended.append("left")

    def clear(self):
        self.cleared += 1


@dataclass
class Settings:
    spec_mode: str = "auto"
    spec_k: int = 4
    last_conversation: int = 0
    map_experts: str = "auto"
    context_budget: int = 8192

    def generation_options(self):
        return GenerationOptions(system_prompt="Be brief.", max_new_tokens=8)


INFO = ModelInfo("demo", "/x", "demo", "d", "f32", "f32", True, True, "", 8192, 1, 0.1)


@pytest.fixture
def world(tmp_path):
    store = Store(tmp_path / "data")
    engine, view, composer = FakeEngine(), FakeView(), FakeComposer()
    m = ConversationModel(store, Settings(), engine, view, composer, PerfStats())
    events = []
    m.busy_changed = lambda busy: events.append(("busy", busy))
    m.answer_finished = lambda state: events.append(("finished", state))
    m.notice = lambda kind, text: events.append(("notice", kind, text))
    yield m, store, engine, view, composer, events
    store.close()


def profile(**kw):
    return StepProfile(step=0, context=10, n_tokens=1, emitted=1, **kw)


def finished(reason="max_tokens", **kw):
    base = dict(generated_tokens=2, tokens_per_s=12.5, prompt_tokens=30, prefill_ms=4.0,
                vision_ms=0.0, reused_tokens=7)  # fmt: skip
    return Finished(reason, **{**base, **kw})


def test_a_turn_commits_streams_and_finishes(world, monkeypatch):
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    assert m.ready and engine.prepared[-1].conversation_id is None
    assert m.send("What is a lake?")
    cid = m.current_id
    rows = store.messages(cid)
    assert [(r.role, r.state) for r in rows] == [("user", "done"), ("assistant", "streaming")]
    job = engine.jobs[-1]
    assert [t.text for t in job.turns] == ["What is a lake?"] and job.conversation_id == cid
    assert m.busy and composer.busy and ("busy", True) in events
    m.on_event(job.job_id, PrefillDone(n_tokens=30, vision_ms=0.0, prefill_ms=4.0, reused=7))
    m.on_event(job.job_id, Tokens("A lake", [5, 6], profile()))
    m.flush()
    answer = view.items[-1]
    assert answer.streamed == ["A lake"]
    m.on_event(job.job_id + 1, Tokens(" ignored", [1], profile()))  # another job's event
    m.on_event(job.job_id, finished(notices=["speculative decoding is off"], token_ids=[5, 6]))
    assert not m.busy and not composer.busy and ("finished", "done") in events
    row = store.messages(cid)[-1]
    assert (row.text, row.state) == ("A lake", "done")
    assert row.stats["tokens"] == 2 and row.stats["reused_tokens"] == 7
    assert row.stats["notices"] == ["speculative decoding is off"]
    assert answer.finished[1] == "done" and answer.notices == ["speculative decoding is off"]
    assert m.stats.decode_tokens_per_s == 12.5
    # the answer's ids are stored and go back to the engine with the next question
    assert row.stats["token_ids"] == [5, 6]
    assert [(t.role, t.ids) for t in m.turns(store.messages(cid))] == [
        ("user", None),
        ("assistant", [5, 6]),
    ]


def test_streaming_text_is_committed_now_and_then(world, monkeypatch):
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("Hi")
    job = engine.jobs[-1]
    m.on_event(job.job_id, Tokens("Hel", [1], profile()))
    m.flush()  # too soon after the start: shown, not committed
    assert store.messages(m.current_id)[-1].text == ""
    clock = time.monotonic() + COMMIT_S + 0.1
    monkeypatch.setattr(conv_mod.time, "monotonic", lambda: clock)
    m.on_event(job.job_id, Tokens("lo", [2], profile()))
    m.flush()
    assert store.messages(m.current_id)[-1].text == "Hello"


def test_a_message_waits_for_the_model_and_is_answered_when_it_loads(world):
    m, store, engine, view, composer, events = world
    assert not m.ready and m.send("Early question")
    assert store.messages(m.current_id)[-1].state == "queued" and not engine.jobs
    assert any(e[0] == "notice" and "when the model is ready" in e[2] for e in events)
    m.on_loaded(INFO)
    assert engine.jobs and store.messages(m.current_id)[0].state == "done"


def test_every_message_sent_while_loading_is_answered_and_marked_so(world):
    """Two messages sent before the model loaded: both leave the queued state (the first had
    stayed "waiting for the model to load" for good, across restarts)."""
    m, store, engine, view, composer, events = world
    assert m.send("first while loading") and m.send("second while loading")
    assert [r.state for r in store.messages(m.current_id)] == ["queued", "queued"]
    m.on_loaded(INFO)
    assert [r.state for r in store.messages(m.current_id)] == ["done", "done", "streaming"]
    # the waiting notice is withdrawn (only it: other notices stay when an answer starts)
    assert events[-2:] == [
        ("notice", "done", "Your message is saved and will be answered when the model is ready."),
        ("busy", True),
    ]
    assert [i.state for i in view.items[:2]] == ["done", "done"]


def test_a_load_replaced_by_a_newer_one_ends_quietly(world):
    """Choosing another model while one loads cancels the first: its end (cancelled, failed
    or even loaded) must not end the newer load's progress or say the load was cancelled."""
    m, store, engine, view, composer, events = world
    progress = []
    m.load_progress = lambda f, phase: progress.append(phase)
    m.load_model("/first", "q4", "q8")
    m.load_model("/second", "q8", "q8")
    newer = m.loading
    m.on_load_cancelled()  # the first one's end
    assert m.loading is newer and not any(e[0] == "notice" for e in events)
    m.on_load_progress(0.5, "reading")
    assert progress[-1] == "reading" and not m.ready
    m.on_loaded(INFO)
    assert m.loading is None and m.ready
    m.load_model("/third", "q4", "q8")
    m.load_model("/fourth", "q4", "q8")
    m.on_loaded(INFO)  # the third loaded before it saw its cancel: in use, still loading
    assert m.model is INFO and m.loading is not None and not m.ready
    m.on_load_cancelled()  # the fourth, cancelled by the user
    assert m.loading is None and m.ready
    assert events[-1][0] == "notice" and "previous model stays" in events[-1][2]


def test_a_chat_deleted_in_another_window_gets_a_new_one(world, tmp_path):
    """Another window on the same data folder deleted the chat shown: the message starts a
    new chat (it had failed on a foreign key, every time, the chat still shown)."""
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("Hello")
    m.on_event(engine.jobs[-1].job_id, finished())
    old = m.current_id
    other = Store(tmp_path / "data")
    other.delete_conversation(old)
    other.close()
    assert m.send("Still there?")
    assert m.current_id != old and store.conversation(m.current_id) is not None
    assert [r.text for r in store.messages(m.current_id)][:1] == ["Still there?"]
    assert any(e[0] == "notice" and "deleted in another window" in e[2] for e in events)


def test_a_message_goes_after_the_last_one_shown(world, tmp_path):
    """Another window went on in the same chat: this window's message follows what this
    window shows (a new version beside the other's turn), not the other's last answer, so
    the model never answers from turns this user did not see."""
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("Shared question")
    m.on_event(engine.jobs[-1].job_id, finished())
    cid, shown = m.current_id, [r.id for r in store.messages(m.current_id)]
    other = Store(tmp_path / "data")
    q = other.add_message(cid, "user", "the other window's question")
    other.add_message(cid, "assistant", "the other window's answer", parent_id=q)
    other.close()
    assert m.send("This window's question")
    path = [r.id for r in store.messages(cid)]
    assert path[: len(shown)] == shown and store.messages(cid)[len(shown)].text == (
        "This window's question"
    )
    assert [t.text for t in engine.jobs[-1].turns][-1] == "This window's question"
    assert "the other window's question" not in [t.text for t in engine.jobs[-1].turns]
    m.on_event(engine.jobs[-1].job_id, finished())
    # the other window edits the first question (a new version: its path now goes there)
    shown = [r.id for r in store.messages(cid)]
    other = Store(tmp_path / "data")
    other.add_message(cid, "user", "the other window's edit", parent_id=None)
    other.close()
    assert m.send("Go on")
    rows = store.messages(cid)
    assert [r.id for r in rows][: len(shown)] == shown and rows[len(shown)].text == "Go on"
    assert [t.text for t in engine.jobs[-1].turns][0] == "Shared question"


def test_an_export_mid_answer_finds_the_text_so_far(world):
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("Tell me")
    m.on_event(engine.jobs[-1].job_id, Tokens("Once upon", [1, 2], profile()))
    m.flush()  # shown, too soon to be committed
    assert store.messages(m.current_id)[-1].text == ""
    m.commit_streaming()  # what an export does first
    assert store.messages(m.current_id)[-1].text == "Once upon"


def test_each_message_keeps_the_budget_its_picture_was_sent_with(world, tmp_path):
    """The same picture sent at "fast", then again at the default: the first message still
    carries its own budget, after a restart too (budgets were kept per picture content for
    the app's run: the later send changed the earlier turn, and a restart forgot them)."""
    from PIL import Image

    from merlin.engine.vision.budget import BudgetedImage

    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    picture = tmp_path / "p.png"
    Image.new("RGB", (64, 64), (200, 10, 10)).save(picture)

    @dataclass
    class Attached:
        path: str
        name: str
        tokens: int | None

    m.image_tokens = lambda a: a.tokens
    m.send("Look", [Attached(str(picture), "p.png", 64)])
    m.on_event(engine.jobs[-1].job_id, finished())
    m.send("Again", [Attached(str(picture), "p.png", None)])
    first, second = engine.jobs[-1].turns[0].images[0], engine.jobs[-1].turns[-1].images[0]
    assert isinstance(first, BudgetedImage) and first.tokens == 64
    assert isinstance(second, str) and second == first.path
    reopened = Store(tmp_path / "data")
    rows = reopened.messages(m.current_id)
    assert [r.images[0].tokens for r in rows if r.images] == [64, None]
    reopened.close()


def test_the_load_request_carries_the_map_experts_setting(world):
    m, store, engine, view, composer, events = world
    for setting, wanted in (("always", True), ("never", False), ("auto", None), ("odd", None)):
        m.settings.map_experts = setting  # read at each load, not when the model was made
        m.load_model("/some/folder", "q4", "q8")
        request = engine.loads[-1]
        assert (request.weights, request.kv, request.map_experts) == ("q4", "q8", wanted)
    for budget, wanted in ((2048, 2048), (32768, 32768), (0, None)):  # 0: the model's maximum
        m.settings.context_budget = budget
        m.load_model("/some/folder", "q4", "q8")
        assert engine.loads[-1].context == wanted


def test_stop_edit_regenerate_and_failures(world):
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("First?")
    job = engine.jobs[-1]
    m.stop()
    assert job.cancel.is_set()
    m.on_event(job.job_id, finished("cancelled", generated_tokens=0))
    assert store.messages(m.current_id)[-1].state == "stopped"
    # regenerate the (only) answer: a new version, the stopped one stays
    answer_id = store.messages(m.current_id)[-1].id
    m.regenerate(answer_id)
    assert len(engine.jobs) == 2 and store.messages(m.current_id)[-1].id != answer_id
    assert store.versions(answer_id)[0] == answer_id and view.items[-1].versions == (2, 2)
    m.on_failed(engine.jobs[-1].job_id, "out of memory while answering.")
    row = store.messages(m.current_id)[-1]
    assert row.state == "error" and "out of memory" in row.stats["error"]
    # a failed answer is never sent back to the model
    assert [t.role for t in m.turns(store.messages(m.current_id))] == ["user"]
    # edit the question: a new version of it, nothing asked, nothing replaced
    user_id = store.messages(m.current_id)[0].id
    assert m.edit_target(user_id).text == "First?"
    m.confirm = lambda title, text: pytest.fail("an edit loses nothing: no question")
    assert m.send("First, edited?")
    assert [r.text for r in store.messages(m.current_id)] == ["First, edited?", ""]
    assert store.versions(user_id)[0] == user_id and view.items[0].versions == (2, 2)
    assert store.message_count(m.current_id) == 5
    m.on_job_done(engine.jobs[-1].job_id)  # ended without Finished
    assert store.messages(m.current_id)[-1].state == "error"


def test_trim_notice_sessions_and_conversations(world):
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("Q")
    job = engine.jobs[-1]
    trimmed = ContextTrimmed([0, 1], 40, 100, "engine words")
    m.on_event(job.job_id, trimmed)
    m.on_event(job.job_id, finished(notices=["engine words"]))
    notices = store.messages(m.current_id)[-1].stats["notices"]
    assert len(notices) == 1 and "2 oldest message(s)" in notices[0]  # not shown twice
    cid = m.current_id
    m.on_session_report(SessionReport(cid, "not_saved", "too large"))
    assert m.last_save.action == "not_saved" and events[-1][0] == "notice"
    m.on_session_report(SessionReport(cid, "restored", tokens=50))
    assert m.last_restore.restored
    # open another chat while an answer streams: it is stopped first, then the switch
    m.send("Another")
    job = engine.jobs[-1]
    m.open_conversation(None)
    assert job.cancel.is_set() and m.current_id == cid
    m.on_event(job.job_id, finished("cancelled"))
    assert m.current_id is None and view.items == [] and engine.prepared[-1].conversation_id is None
    m.delete_conversation(cid)
    assert engine.forgotten == [cid] and store.conversation(cid) is None


def test_too_long_message_stays_in_the_composer(world):
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.submit("x" * 200_000, [])
    assert composer.notices and composer.cleared == 0 and m.current_id is None


def test_a_long_chat_opens_with_its_last_messages_then_the_older_in_batches(world):
    """Rendering every message of a long chat at once froze the window: the last
    SHOWN_AT_OPEN go at once, the older OLDER_BATCH at a time through later(), newest first
    above them; opening another chat meanwhile drops the rest of the first one's."""
    from merlin.app.model import conversation

    m, store, engine, view, composer, events = world
    queued = []
    m.later = queued.append
    long = store.create_conversation("long")
    for i in range(30):
        store.add_message(long, "user", f"q{i}")
        store.add_message(long, "assistant", f"a{i}")
    ids = [r.id for r in store.messages(long)]
    m.open_conversation(long)
    assert [v.id for v in view.items] == ids[-conversation.SHOWN_AT_OPEN :]
    assert view.busy is False
    turns = 0
    while queued:
        before = len(view.items)
        queued.pop(0)()
        turns += 1
        assert len(view.items) - before <= conversation.OLDER_BATCH
        assert [v.id for v in view.items] == ids[-len(view.items) :]  # in order, newest kept
    assert [v.id for v in view.items] == ids and turns > 1
    short = store.create_conversation("short")
    store.add_message(short, "user", "hello")
    m.open_conversation(long)
    m.open_conversation(short)  # before the long chat's batches ran
    while queued:
        queued.pop(0)()
    assert [v.text for v in view.items] == ["hello"]


def test_past_auto_shown_older_messages_come_when_the_reader_nears_them(world):
    """A chat of thousands of messages: batches come by themselves until AUTO_SHOWN are
    shown (each lays out the whole column), then one each time the view asks."""
    from merlin.app.model import conversation

    m, store, engine, view, composer, events = world
    queued = []
    m.later = queued.append
    huge = store.create_conversation("huge")
    n = conversation.AUTO_SHOWN + 3 * conversation.OLDER_BATCH
    for i in range(n // 2):
        store.add_message(huge, "user", f"q{i}")
        store.add_message(huge, "assistant", f"a{i}")
    ids = [r.id for r in store.messages(huge)]
    m.open_conversation(huge)
    while queued:
        queued.pop(0)()
    assert len(view.items) == conversation.AUTO_SHOWN and view.more_above
    assert [v.id for v in view.items] == ids[-conversation.AUTO_SHOWN :]
    asks = 0
    while view.more_above:
        m.show_more_above()
        asks += 1
        assert not queued  # nothing more by itself
    assert [v.id for v in view.items] == ids and asks == 3
    m.show_more_above()  # nothing left: nothing happens
    assert len(view.items) == n
    m.open_conversation(huge)  # a new opening starts over
    assert len(view.items) == conversation.SHOWN_AT_OPEN and not view.more_above


def test_the_conversation_model_imports_without_qt():
    code = (
        "import sys, merlin.app.model.conversation, merlin.app.model.jobs; "
        "print(any(m.startswith(('PySide6', 'shiboken6')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_deleting_another_chat_lets_the_answer_stream_on(world):
    """An answer streaming in one chat went 'stopped' when any other chat was deleted."""
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("First chat?")
    m.on_event(engine.jobs[-1].job_id, finished())
    other = m.current_id
    m.open_conversation(None)
    m.send("Second chat?")
    job = engine.jobs[-1]
    m.delete_conversation(other)
    assert not job.cancel.is_set() and m.busy
    assert store.conversation(other) is None and engine.forgotten == [other]
    m.on_event(job.job_id, finished())
    assert store.messages(m.current_id)[-1].state == "done"
    m.send("Again?")
    job = engine.jobs[-1]
    m.delete_conversation(m.current_id)  # its own chat: the answer stops first
    assert job.cancel.is_set()
    m.on_event(job.job_id, finished("cancelled", generated_tokens=0))
    # a chat whose opening waits for the answer to stop, deleted meanwhile: not opened
    m.send("A third chat?")
    third = m.current_id
    m.on_event(engine.jobs[-1].job_id, finished())
    m.open_conversation(None)
    m.send("A fourth?")
    job = engine.jobs[-1]
    m.open_conversation(third)  # waits for the answer to stop
    m.delete_conversation(third)
    m.on_event(job.job_id, finished("cancelled", generated_tokens=0))
    assert store.conversation(third) is None and m.current_id is None


def test_a_failing_store_says_so_for_rename_delete_thinking_and_regenerate(world, monkeypatch):
    """A full disk: each of these had raised out of the Qt slot (a traceback, no notice; the
    list showed a name the store did not keep; a regenerate took the old answer off the
    screen)."""
    from merlin.app.model.store import StoreError

    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("A question?")
    m.on_event(engine.jobs[-1].job_id, finished())
    cid = m.current_id
    answer = store.messages(cid)[-1]

    def full(*_args, **_kw):
        raise StoreError("the disk is full")

    for name in ("rename_conversation", "delete_conversation", "set_thinking", "add_message"):
        monkeypatch.setattr(store, name, full)
    m.rename_conversation(cid, "new name")
    m.delete_conversation(cid)
    m.set_thinking("on")
    m.regenerate(answer.id)
    notices = [e[2] for e in events if e[0] == "notice" and e[1] == "error"]
    assert len(notices) == 4 and all("the disk is full" in n for n in notices)
    assert "not renamed" in notices[0] and "not deleted" in notices[1]
    assert store.conversation(cid) is not None and m.current_id == cid
    assert [i.id for i in view.items] == [r.id for r in store.messages(cid)]  # answer shown


def test_the_waiting_notice_goes_when_the_model_is_ready_even_if_its_chat_is_gone(world):
    """A message sent while the model loads, its chat deleted: the "will be answered when
    the model is ready" notice had stayed for good, over every later chat."""
    m, store, engine, view, composer, events = world
    assert m.send("Early question")
    m.delete_conversation(m.current_id)
    assert m.current_id is None
    m.on_loaded(INFO)
    assert events[-1] == ("notice", "done", m._waiting_notice()) and not m.waiting_for_model
