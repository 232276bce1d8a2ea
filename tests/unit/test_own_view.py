"""Own-view is append-only: a specialist's prompt at a turn it answers, rendered with the base model's
real chat template, is a byte prefix of its prompt at every later turn, whatever the conversation and
the routing."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from macaron_ray.core.conversation import FunctionCall, Message, ToolCall, TurnMeta, split_turns
from macaron_ray.core.own_view import own_view, summary_note
from macaron_ray.model.chat_template import load_chat_template
from macaron_ray.model.prepare import prepare_base_model
from macaron_ray.specialists.labels import LABELS

TOOLS = [{"type": "function", "function": {"name": "set_reminder", "description": "Remind.",
                                           "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepare_base_model())


def render(tokenizer, messages: list[dict], tools) -> str:
    # As vLLM does before templating: tool-call arguments become mappings.
    msgs = json.loads(json.dumps(messages))
    for m in msgs:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return tokenizer.apply_chat_template(msgs, tools=tools, chat_template=load_chat_template(),
                                         tokenize=False, add_generation_prompt=True)


text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=30)
turn = st.tuples(
    text,                                   # user message
    st.sampled_from(LABELS),                # who answered
    text,                                   # answer text
    st.none() | st.dictionaries(st.sampled_from(["text", "when"]), text, max_size=2),  # a tool call?
    text,                                   # summary
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(turn, min_size=1, max_size=7), system=st.none() | text, with_tools=st.booleans())
def test_each_specialists_prompt_is_a_byte_prefix_of_its_later_prompts(tokenizer, turns, system, with_tools):
    tools = TOOLS if with_tools else None
    messages: list[Message] = [Message(role="system", content=system)] if system is not None else []
    metas: list[TurnMeta] = []
    prompts: dict[str, list[str]] = {label: [] for label in LABELS}

    for i, (user_text, label, answer, call_args, summary) in enumerate(turns):
        messages.append(Message(role="user", content=user_text))
        history = split_turns("tenant", messages)
        past = list(zip(history.turns[:-1], metas))
        # The prompt of the specialist that answers this turn (only it prefills one; the others'
        # views of this turn show its summary, which does not extend an open assistant turn).
        prompts[label].append(render(tokenizer, own_view(label, history.instructions, past, history.turns[-1]), tools))
        if call_args is not None:
            call = ToolCall(id=f"call_{i}", function=FunctionCall(name="set_reminder", arguments=json.dumps(call_args)))
            messages += [Message(role="assistant", tool_calls=(call,)),
                         Message(role="tool", tool_call_id=call.id, content=json.dumps({"ok": True}))]
            history = split_turns("tenant", messages)
            prompts[label].append(render(tokenizer, own_view(label, history.instructions, past, history.turns[-1]), tools))
        messages.append(Message(role="assistant", content=answer))
        metas.append(TurnMeta(label=label, summary=summary))

    for s, seq in prompts.items():
        for n, earlier in enumerate(seq):
            for later in seq[n + 1:]:
                assert later.startswith(earlier), (s, n)


def test_own_turns_verbatim_others_summarized():
    call = ToolCall(id="c1", function=FunctionCall(name="set_reminder", arguments='{"text": "milk"}'))
    msgs = [Message(role="system", content="be brief"), Message(role="user", content="remind me"),
            Message(role="assistant", tool_calls=(call,)), Message(role="tool", tool_call_id="c1", content="ok"),
            Message(role="assistant", content="Reminder set."), Message(role="user", content="code please"),
            Message(role="assistant", content="print(1)"), Message(role="user", content="and now?")]
    h = split_turns("t", msgs)
    metas = [TurnMeta(label="L1", summary="set a reminder"), TurnMeta(label="L2", summary="wrote code")]
    past = list(zip(h.turns[:-1], metas))
    as_l1 = own_view("L1", h.instructions, past, h.turns[-1])
    assert as_l1 == [m.to_openai() for m in msgs[:6]] + [
        summary_note("wrote code"), {"role": "user", "content": "and now?"}]
    as_l3 = own_view("L3", h.instructions, past, h.turns[-1])
    assert as_l3 == [msgs[0].to_openai(), msgs[1].to_openai(), summary_note("set a reminder"),
                     msgs[5].to_openai(), summary_note("wrote code"), msgs[7].to_openai()]
    assert all(m["role"] != "assistant" for m in as_l3)  # nothing of another's turn reads as its own reply
