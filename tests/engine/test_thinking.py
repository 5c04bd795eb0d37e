"""Thinking models (engine.thinking): the stream splitter on generated and adversarial streams,
template support detection, the thinking budget closing the block (on a copy of the random
demo checkpoint with a Thinking-style template), the next turn's prompt keeping or dropping
reasoning as the template says, and merlin-cli --thinking."""

import json
import random

import pytest
from support import assert_user_error, run_cli
from thinking_fixtures import SWITCHABLE_TEMPLATE, THINKING_TEMPLATE, checkpoint_with_template

from merlin.engine import thinking
from merlin.engine.errors import InputError
from merlin.engine.generate import AnswerOptions, Finished, Tokens, event_json, generate
from merlin.engine.prompt import build_prompt
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import Message, Session
from merlin.engine.thinking import ReasoningSplitter, split_text

GREEDY = SamplingParams(temperature=0.0)


# ---- the splitter ------------------------------------------------------------------------------


def _stream(text: str, cuts: list[int], opened: bool) -> tuple[str, str, bool]:
    s = ReasoningSplitter(opened)
    answer, reasoning = [], []
    last = 0
    for c in [*cuts, len(text)]:
        a, r = s.push(text[last:c])
        answer.append(a)
        reasoning.append(r)
        last = c
    a, r = s.finish()
    return "".join(reasoning) + r, "".join(answer) + a, s.closed


def _reference(text: str, opened: bool) -> tuple[str, str]:
    """What a Qwen3 template extracts from content (one `</think>`)."""
    if not opened:
        stripped = text.lstrip()
        if not stripped.startswith("<think>"):
            return "", text
        text = stripped[len("<think>") :]
    if "</think>" not in text:
        return text.lstrip("\n").rstrip("\n"), ""
    head, tail = text.split("</think>", 1)
    return head.rstrip("\n").lstrip("\n"), tail.lstrip("\n")


PIECES = ["a", "\n", "\n\n", "<", ">", "/", "think", "<t", "</", "x + y", "$\\frac{1}{2}$", "中文",
          "```py\nprint(1)\n```", " ", "</thin", "k>", "<thi", "nk"]  # fmt: skip


@pytest.mark.parametrize("seed", range(60))
def test_any_chunking_splits_like_the_template(seed):
    rng = random.Random(seed)
    opened = seed % 2 == 0
    reasoning = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
    reasoning = reasoning.replace("</think>", "")  # one close, as the model writes it
    answer = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
    kind = rng.choice(["closed", "open", "none"])
    if kind == "closed":
        text = reasoning + "\n</think>\n\n" + answer
    elif kind == "open":
        text = reasoning
    else:
        text = answer
    if not opened and kind != "none":
        text = rng.choice(["", "\n", " "]) + "<think>\n" + text
    whole = split_text(text, opened)
    want = _reference(text, opened) if kind == "closed" or opened or not text.strip() else None
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text), rng.randint(0, 8))))
        assert _stream(text, cuts, opened) == whole, (text, cuts)
    # one character a chunk: a tag split in every possible place
    assert _stream(text, list(range(1, len(text))), opened) == whole
    if want is not None and (kind != "none" or opened):
        assert whole[:2] == want, text


def test_adversarial_streams():
    # a block that never closes is all reasoning; nothing leaks to the answer
    assert split_text("step 1\nstep 2\n", opened=True) == ("step 1\nstep 2", "", False)
    # no block: all answer, tags later on stay answer text
    assert split_text("Use <think> tags.", opened=False) == ("", "Use <think> tags.", False)
    assert split_text("Hello </think> there", opened=False)[1] == "Hello </think> there"
    # an opening tag after leading whitespace, closing tag and newlines stripped as templates do
    assert split_text(" \n<think>\n\nwhy\n\n</think>\n\nbecause", False) == (
        "why",
        "because",
        True,
    )
    # only the first </think> ends the block
    assert split_text("r</think>a</think>b", True) == ("r", "a</think>b", True)
    # a partial closing tag that never completes is reasoning text
    assert split_text("almost </thi", True) == ("almost </thi", "", False)
    # `<` at the end of an answer is kept (held back, then flushed)
    assert _stream("x</think>1 <", [9, 11], True) == ("x", "1 <", True)
    # newlines inside reasoning are kept, only those next to the tags go
    assert split_text("\na\n\nb\n</think>c", True) == ("a\n\nb", "c", True)
    # an answer that starts with a partial <think> that turns out to be something else
    assert split_text("<thin client>", False) == ("", "<thin client>", False)
    assert split_text("", True) == ("", "", False)


# ---- support -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def think_dir(demo_dir, tmp_path_factory):
    return checkpoint_with_template(demo_dir, tmp_path_factory.mktemp("t") / "t", THINKING_TEMPLATE)


@pytest.fixture(scope="module")
def switch_dir(demo_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("s") / "s"
    return checkpoint_with_template(demo_dir, root, SWITCHABLE_TEMPLATE)


@pytest.fixture(scope="module")
def think_model(think_dir):
    from merlin.engine.model import load_model

    return load_model(think_dir)


@pytest.fixture(scope="module")
def switch_model(switch_dir):
    from merlin.engine.model import load_model

    return load_model(switch_dir)


def test_support(demo_model, think_model, switch_model):
    none = thinking.support(demo_model.tokenizer)
    assert not none.supported and "thinking" in none.reason
    always = thinking.support(think_model.tokenizer)
    assert always.supported and always.opens and not always.switchable
    switch = thinking.support(switch_model.tokenizer)
    assert switch.supported and switch.switchable and not switch.opens
    with pytest.raises(InputError, match="no thinking block"):
        thinking.template_kwargs(none, "on")
    assert thinking.template_kwargs(none, "off") == {}
    assert thinking.template_kwargs(switch, "off") == {"enable_thinking": False}
    assert thinking.template_kwargs(switch, "on") == {"enable_thinking": True}
    with pytest.raises(InputError, match="one of"):
        thinking.template_kwargs(switch, "maybe")


def test_switchable_template_off_and_on(switch_model):
    tok = switch_model.tokenizer
    s = Session(switch_model)
    opts = AnswerOptions(sampling=GREEDY, max_new_tokens=6, ignore_eos=True, thinking="off")
    events = list(s.ask("hi", options=opts))
    prompt_text = tok.decode(s.token_ids[: -6 + 1])
    assert prompt_text.rstrip().endswith("</think>")  # the template closed the block
    fin = events[-1]
    assert fin.reasoning == "" and fin.text  # a thinking template, no reasoning
    s2 = Session(switch_model)
    opts = AnswerOptions(sampling=GREEDY, max_new_tokens=6, ignore_eos=True, thinking="on")
    list(s2.ask("hi", options=opts))
    assert "</think>" not in tok.decode(s2.token_ids)


# ---- the budget --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["off", "on"])
def test_budget_closes_the_block(think_model, spec):
    tok = think_model.tokenizer
    close, end = thinking.close_ids(tok)
    assert end == tok.token_id("</think>") and end in close
    budget = 7
    s = Session(think_model)
    opts = AnswerOptions(
        sampling=GREEDY, max_new_tokens=30, ignore_eos=True, thinking_budget=budget, spec=spec
    )
    events = list(s.ask("Think about it.", options=opts))
    fin = events[-1]
    assert isinstance(fin, Finished) and fin.thinking_budget_closed
    ids = fin.token_ids
    assert ids[budget : budget + len(close)] == close  # the engine's ids after N tokens
    assert end not in ids[:budget]
    tokens = [e for e in events if isinstance(e, Tokens)]
    assert sum(e.reasoning_ids for e in tokens) == fin.reasoning_tokens
    assert fin.reasoning_tokens == budget + close.index(end) + 1
    assert "".join(e.reasoning for e in tokens) == fin.reasoning
    assert "".join(e.text for e in tokens) == fin.text
    assert "</think>" not in fin.text and "</think>" not in fin.reasoning
    # the session keeps reasoning apart, and the answer's own ids
    m = s.messages[-1]
    assert m.reasoning == fin.reasoning and m.text == fin.text
    assert m.ids is not None and tok.decode(m.ids) == m.text
    # what the cache holds: the prompt and every id fed (the last one is not fed yet)
    assert s.token_ids[-(len(ids) - 1) :] == ids[:-1]


def test_budget_with_drafts_gives_the_plain_greedy_answer(think_model):
    """Speculative drafts replaced by the closing ids never stay in the cache: the answer
    equals the one without drafts, token for token."""
    p = build_prompt(think_model.tokenizer, think_model.config, "Count: 1 2 1 2 1 2 1 2")
    runs = []
    for spec in ("off", "on"):
        opts = AnswerOptions(
            sampling=GREEDY, max_new_tokens=40, ignore_eos=True, thinking_budget=5, spec=spec
        )
        runs.append(list(generate(think_model, p, opts))[-1].token_ids)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("k", [4, 8])
def test_budget_with_drafts_gives_the_plain_sampled_answer(think_model, k):
    """Sampled with a seed: the budget closing the block in the middle of a verified run
    makes its later positions void; their random numbers are given back, so the answer is
    plain decoding's token for token (they had been spent, and every later token differed).
    The drafter knows the answer without a budget (the same draws up to the budget), so a
    verified run goes past the position where the budget replaces the sampled token."""
    from merlin.engine.speculative import Drafter

    p = build_prompt(think_model.tokenizer, think_model.config, "Count: 1 2 1 2 1 2 1 2")
    for seed in range(3):
        sampling = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, seed=seed)
        opts = dict(sampling=sampling, max_new_tokens=30, ignore_eos=True, thinking_budget=5)
        plain = list(generate(think_model, p, AnswerOptions(**opts, spec="off")))[-1]
        assert plain.thinking_budget_closed
        free = {**opts, "thinking_budget": None}
        unbudgeted = list(generate(think_model, p, AnswerOptions(**free, spec="off")))[-1]
        drafter = Drafter()
        drafter.extend(list(p.ids) + unbudgeted.token_ids + [0])
        drafter.extend(list(p.ids))
        spec = list(
            generate(think_model, p, AnswerOptions(**opts, spec="on", spec_k=k), drafter=drafter)
        )
        assert spec[-1].token_ids == plain.token_ids, (seed, k)
        assert spec[-1].spec["hits"] > 0


def test_thinking_off_on_an_always_thinking_template_answers_at_once(think_model):
    close, _ = thinking.close_ids(think_model.tokenizer)
    s = Session(think_model)
    opts = AnswerOptions(sampling=GREEDY, max_new_tokens=10, ignore_eos=True, thinking="off")
    fin = list(s.ask("hi", options=opts))[-1]
    assert fin.token_ids[: len(close)] == close
    assert fin.reasoning == "" and fin.text


def test_event_json_marks_reasoning(think_model):
    p = build_prompt(think_model.tokenizer, think_model.config, "hi")
    opts = AnswerOptions(sampling=GREEDY, max_new_tokens=12, ignore_eos=True, thinking_budget=4)
    events = [event_json(e) for e in generate(think_model, p, opts)]
    toks = [e for e in events if e["event"] == "tokens" and e["ids"]]
    assert toks[0]["reasoning_ids"] == 1 and "reasoning" in toks[0]
    assert "reasoning_ids" not in toks[-1]  # answer tokens are unmarked
    assert "reasoning" in events[-1] and events[-1]["reasoning_tokens"] >= 4


# ---- the next turn's prompt --------------------------------------------------------------------


def _decoded(model, messages, gen=True):
    p = build_prompt(model.tokenizer, model.config, messages, generation_prompt=gen)
    return model.tokenizer.decode(p.ids), p


def test_next_prompt_drops_reasoning_as_the_template_says(think_model, demo_model):
    answer = Message.assistant("Paris.", reasoning="MARKER-REASONING")
    convo = [Message.user("Capital?"), answer, Message.user("And Spain?")]
    text, _ = _decoded(think_model, convo)
    assert "Paris." in text and "MARKER-REASONING" not in text
    # the answer after the last question (a warm-up of a finished chat) keeps it
    text, _ = _decoded(think_model, convo[:2], gen=False)
    assert "<think>\nMARKER-REASONING\n</think>\n\nParis." in text
    # an Instruct template never sees reasoning
    text, _ = _decoded(demo_model, convo[:2], gen=False)
    assert "MARKER" not in text and "Paris." in text


def test_a_template_that_keeps_reasoning_gets_it(demo_dir, tmp_path):
    from merlin.engine.model import load_model

    keep = THINKING_TEMPLATE.replace("loop.index0 > ns.last_query", "true")
    model = load_model(checkpoint_with_template(demo_dir, tmp_path / "k", keep))
    convo = [Message.user("Q"), Message.assistant("A.", reasoning="KEPT"), Message.user("Q2")]
    text, _ = _decoded(model, convo)
    assert "<think>\nKEPT\n</think>\n\nA." in text


def test_second_turn_reuses_the_answer_ids(think_model):
    s = Session(think_model)
    opts = AnswerOptions(sampling=GREEDY, max_new_tokens=20, ignore_eos=True, thinking_budget=6)
    list(s.ask("one", options=opts))
    first = s.messages[-1]
    assert first.reasoning and first.ids
    events = list(s.ask("two", options=AnswerOptions(sampling=GREEDY, max_new_tokens=3)))
    prompt = s.token_ids
    n = len(first.ids)
    assert any(prompt[i : i + n] == first.ids for i in range(len(prompt) - n))
    assert first.reasoning not in think_model.tokenizer.decode(prompt)
    assert events[-1].reused_tokens > 0
    # the message survives the session file with its reasoning
    assert Message.from_json(first.to_json()) == first


def test_app_style_messages_adopt_reasoning(think_model):
    """The app sends the conversation as text: the session keeps the reasoning it knows."""
    s = Session(think_model)
    opts = AnswerOptions(sampling=GREEDY, max_new_tokens=15, ignore_eos=True, thinking_budget=5)
    list(s.ask("one", options=opts))
    known = s.messages[-1]
    s.set_messages([Message.user("one"), Message.assistant(known.text)])
    assert s.messages[-1].reasoning == known.reasoning and s.messages[-1].ids == known.ids


# ---- the CLI -----------------------------------------------------------------------------------


def test_cli_thinking_on_without_support_is_a_clear_error(demo_dir):
    for cmd in ("generate", "chat"):
        args = [cmd, "--model", str(demo_dir), "--thinking", "on"]
        r = run_cli(*args, *(["hi"] if cmd == "generate" else []))
        assert_user_error(r, "thinking is switched on", "no thinking block")


def test_cli_json_marks_reasoning_and_text_mode_keeps_it_off_stdout(think_dir):
    base = ("generate", "--model", str(think_dir), "--temperature", "0", "--ignore-eos")
    r = run_cli(*base, "--max-new-tokens", "16", "--thinking-budget", "5", "--json", "hi")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    fin = events[-1]
    assert fin["thinking_budget_closed"] is True and fin["reasoning"]
    marked = [e for e in events if e.get("reasoning_ids")]
    assert marked and "".join(e["reasoning"] for e in marked) == fin["reasoning"]
    plain = run_cli(*base, "--max-new-tokens", "16", "--thinking-budget", "5", "hi")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == fin["text"].strip()
    assert "[thinking]" in plain.stderr and fin["reasoning"] in plain.stderr
    off = run_cli(*base, "--max-new-tokens", "8", "--thinking", "off", "--json", "hi")
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout.splitlines()[-1])["reasoning"] == ""


def test_cli_info_says_what_the_template_offers(think_dir, demo_dir):
    r = run_cli("info", "--model", str(think_dir), "--json")
    assert r.returncode == 0, r.stderr
    th = json.loads(r.stdout)["thinking"]
    assert th["supported"] and th["opens"] and not th["switchable"]
    r = run_cli("info", "--model", str(demo_dir), "--json")
    assert json.loads(r.stdout)["thinking"]["supported"] is False


def test_a_template_that_only_renders_old_reasoning_is_no_thinking_template(demo_dir, tmp_path):
    from merlin.engine.model import load_model

    instruct = THINKING_TEMPLATE.replace("'<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}",
                                         "'<|im_start|>assistant\\n' }}\n{%- endif %}")  # fmt: skip
    assert instruct != THINKING_TEMPLATE
    model = load_model(checkpoint_with_template(demo_dir, tmp_path / "i", instruct))
    assert not thinking.support(model.tokenizer).supported
