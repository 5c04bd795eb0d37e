"""Versions of messages in the app's turn flow without Qt (model/branching.py): regenerate and
edit keep the old version, "< 2/3 >" switches, a switch while an answer streams stops it and
keeps it. ConversationModel over a real store, with the fakes of test_conversation_model."""

from __future__ import annotations

from test_conversation_model import INFO, finished, profile, world  # noqa: F401 (fixture)

from merlin.engine.generate import Tokens


def answer(m, engine, text, ids, reason="stop_token"):
    job = engine.jobs[-1]
    m.on_event(job.job_id, Tokens(text, ids, profile()))
    m.on_event(job.job_id, finished(reason, token_ids=ids))
    return job


def shown(view):
    return [(i.role, i.text, i.versions) for i in view.items]


def test_regenerate_twice_then_switch_back_and_ask_on(world):  # noqa: F811
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("Name a colour")
    answer(m, engine, "Red", [11])
    first = view.items[-1].id
    m.regenerate(first)
    answer(m, engine, "Blue", [12])
    m.regenerate(view.items[-1].id)
    answer(m, engine, "Green", [13])
    assert shown(view) == [("user", "Name a colour", (1, 1)), ("assistant", "Green", (3, 3))]
    versions = store.versions(first)
    assert len(versions) == 3 and versions[0] == first
    # the regenerate jobs asked the same question; nothing of the old answers went with them
    assert [[t.text for t in j.turns] for j in engine.jobs] == [["Name a colour"]] * 3
    # back to 1/3, one step at a time
    m.switch_version(view.items[-1].id, -1)
    assert shown(view)[-1] == ("assistant", "Blue", (2, 3))
    m.switch_version(view.items[-1].id, -1)
    assert shown(view)[-1] == ("assistant", "Red", (1, 3))
    m.switch_version(view.items[-1].id, -1)  # no version before the first: nothing happens
    assert view.items[-1].id == first
    assert engine.prepared[-1].turns[-1].ids == [11]  # the engine switches to this branch
    # the next question follows the first answer, which goes to the engine as its ids
    m.send("Another?")
    turns = engine.jobs[-1].turns
    assert [(t.role, t.text, t.ids) for t in turns] == [
        ("user", "Name a colour", None),
        ("assistant", "Red", [11]),
        ("user", "Another?", None),
    ]
    answer(m, engine, "Yellow", [14])
    # stored: the choice survives reopening the chat, the other versions too
    cid = m.current_id
    m.open_conversation(None)
    m.open_conversation(cid)
    assert [(i.text, i.versions) for i in view.items] == [
        ("Name a colour", (1, 1)),
        ("Red", (1, 3)),
        ("Another?", (1, 1)),
        ("Yellow", (1, 1)),
    ]
    m.switch_version(view.items[1].id, +2)  # 3/3 has no follow-up
    assert [i.text for i in view.items] == ["Name a colour", "Green"]
    assert store.message_count(cid) == 6


def test_editing_a_middle_question_keeps_the_old_tail(world):  # noqa: F811
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    for q, a in (("q1", "a1"), ("q2", "a2"), ("q3", "a3")):
        m.send(q)
        answer(m, engine, a, [len(engine.jobs)])
    old = [i.id for i in view.items]
    q2 = old[2]
    assert m.edit_target(q2).text == "q2"
    assert m.send("q2 edited")
    assert [j.turns[-1].text for j in engine.jobs[-1:]] == ["q2 edited"]
    assert len(engine.jobs[-1].turns) == 3  # q1, a1, the edited q2
    answer(m, engine, "a2 edited", [9])
    assert [(i.text, i.versions) for i in view.items] == [
        ("q1", (1, 1)),
        ("a1", (1, 1)),
        ("q2 edited", (2, 2)),
        ("a2 edited", (1, 1)),
    ]
    assert m.editing_id is None
    # the old tail is one click away, whole
    m.switch_version(view.items[2].id, -1)
    assert [i.id for i in view.items] == old
    assert [i.text for i in view.items] == ["q1", "a1", "q2", "a2", "q3", "a3"]
    assert view.items[2].versions == (1, 2)
    # the first question edited: a new first message, the whole old chat stays below q1
    m.edit_target(old[0])
    m.send("q1 edited")
    answer(m, engine, "a1 edited", [10])
    assert [i.text for i in view.items] == ["q1 edited", "a1 edited"]
    assert len(engine.jobs[-1].turns) == 1
    m.switch_version(view.items[0].id, -1)
    assert [i.text for i in view.items] == ["q1", "a1", "q2", "a2", "q3", "a3"]
    # deleting the chat deletes every branch
    cid = m.current_id
    assert store.message_count(cid) == 10
    m.delete_conversation(cid)
    assert store.message_count(cid) == 0 and store.conversation(cid) is None
    assert engine.forgotten == [cid] and view.items == []


def test_a_switch_while_an_answer_streams_stops_it_and_keeps_it(world):  # noqa: F811
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("Tell me a story")
    answer(m, engine, "Once.", [1])
    m.regenerate(view.items[-1].id)
    job = engine.jobs[-1]
    m.on_event(job.job_id, Tokens("Long ago", [2, 3], profile()))
    m.flush()
    streaming = view.items[-1]
    assert streaming.versions == (2, 2) and m.busy
    m.switch_version(streaming.id, -1)
    # stop first: the switch waits for the engine to end the answer
    assert job.cancel.is_set() and view.items[-1] is streaming
    m.on_event(job.job_id, Tokens(" there", [4], profile()))  # what was already on its way
    m.on_event(job.job_id, finished("cancelled", token_ids=[2, 3, 4]))
    assert not m.busy and ("finished", "stopped") in events
    assert [(i.text, i.versions) for i in view.items][-1] == ("Once.", (1, 2))
    # nothing lost: the partial answer is its own version, stopped
    m.switch_version(view.items[-1].id, +1)
    row = store.messages(m.current_id)[-1]
    assert (row.text, row.state, row.version, row.versions) == ("Long ago there", "stopped", 2, 2)
    assert view.items[-1].text == "Long ago there"


def test_a_switch_ends_an_edit_and_a_queued_question_gets_its_answer(world):  # noqa: F811
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    m.send("q")
    answer(m, engine, "a", [1])
    m.regenerate(view.items[-1].id)
    answer(m, engine, "b", [2])
    m.edit_target(view.items[0].id)
    m.switch_version(view.items[-1].id, -1)
    assert (
        m.editing_id is None and composer.ended[-1] == "left"
    )  # the draft comes back, the rewrite after it
    assert [i.text for i in view.items] == ["q", "a"]
    n_jobs = len(engine.jobs)
    m.switch_version(view.items[-1].id, +5)  # out of range: nothing
    assert [i.text for i in view.items] == ["q", "a"] and len(engine.jobs) == n_jobs


def test_regenerating_an_earlier_answer_branches_there_and_ends_an_edit_below(world):  # noqa: F811
    m, store, engine, view, composer, events = world
    m.on_loaded(INFO)
    for q, a, ids in (("One?", "1", [21]), ("Two?", "2", [22]), ("Three?", "3", [23])):
        m.send(q)
        answer(m, engine, a, ids)
    old = [(i.id, i.text) for i in view.items]
    assert m.edit_target(old[4][0]) is not None  # editing "Three?" when the user regenerates
    m.regenerate(old[1][0])  # the first of three answers
    assert (
        m.editing_id is None and composer.ended[-1] == "left"
    )  # the draft comes back, the rewrite after it
    assert [[t.text for t in j.turns] for j in engine.jobs][-1] == ["One?"]
    answer(m, engine, "one", [31])
    assert shown(view) == [("user", "One?", (1, 1)), ("assistant", "one", (2, 2))]
    m.switch_version(view.items[-1].id, -1)
    assert [(i.id, i.text) for i in view.items] == old  # the old branch, whole
    assert view.items[1].versions == (1, 2)
