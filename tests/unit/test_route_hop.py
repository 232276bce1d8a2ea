"""The route request: the labels' shared start goes in the prompt, the engine decodes the rest."""

from __future__ import annotations

from macaron_ray.core import route_hop
from macaron_ray.core.route_hop import route_messages
from macaron_ray.engine.openai_http import request_body


def test_the_shared_start_of_the_labels_is_prefilled_and_the_endings_are_the_choice():
    req = route_hop.route_request("adapter-l0", "fix my regex")
    assert req.messages[-1] == {"role": "assistant", "content": "L"}
    assert req.choice == ("0", "1", "2", "3") and req.max_tokens == 1
    body = request_body(req)
    assert body["structured_outputs"] == {"choice": ["0", "1", "2", "3"]}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_every_output_completes_the_label_it_names():
    assert [route_hop.parse_label(d) for d in ("0", "1", " 2", "3\n")] == ["L0", "L1", "L2", "L3"]
    assert route_hop.parse_label("L2") is None  # not a continuation of "L"
    assert route_hop.parse_label("7") is None and route_hop.parse_label("") is None


def test_a_label_that_starts_another_keeps_an_ending_to_decode():
    labels = ("A1", "A10", "A2")
    assert route_hop.label_prefix(labels) == "A"
    req = route_hop.route_request("x", "hi", labels)
    assert req.choice == ("1", "10", "2") and req.max_tokens == 2
    assert route_hop.parse_label("10", labels) == "A10"


def test_labels_with_nothing_in_common_are_decoded_whole():
    labels = ("chat", "agent")
    assert route_hop.label_prefix(labels) == ""
    req = route_hop.route_request("x", "hi", labels)
    assert req.messages[-1]["role"] == "user" and not req.continue_final_message
    assert req.choice == labels and req.max_tokens == 5
    assert "continue_final_message" not in request_body(req)


def test_the_budget_never_exceeds_the_design_cap():
    labels = ("x" * 40, "y" * 50)
    assert route_hop.route_request("x", "hi", labels).max_tokens == route_hop.ROUTE_BUDGET_TOKENS


def test_the_context_block_follows_the_cached_scaffold_and_is_cut_to_its_budget():
    from macaron_ray.core.route_hop import ROUTE_CONTEXT_MAX_CHARS, RouteContext, route_messages

    plain = route_messages("make the buttons bigger")
    with_context = route_messages("make the buttons bigger", context=RouteContext("L3", "built a counter card"))
    assert with_context[0] == plain[0]  # the scaffold, cached, comes first and is the same
    assert with_context[1]["content"] == "Previous turn (L3): built a counter card\nNew message: make the buttons bigger"
    assert with_context[2] == plain[2] == {"role": "assistant", "content": "L"}
    block = RouteContext("L2", "word " * 200).block()
    assert block.startswith("Previous turn (L2): word") and block.endswith("…")
    assert len(block) <= len("Previous turn (L2): ") + ROUTE_CONTEXT_MAX_CHARS


def test_an_answer_requests_penalties_reach_the_engine_only_when_set():
    from macaron_ray.core.engine_client import EngineRequest

    messages = [{"role": "user", "content": "hi"}]
    body = request_body(EngineRequest("a", messages, repetition_penalty=1.1, frequency_penalty=0.3))
    assert (body["repetition_penalty"], body["frequency_penalty"]) == (1.1, 0.3)
    assert not {"repetition_penalty", "frequency_penalty"} & set(request_body(EngineRequest("a", messages)))


def test_the_route_hop_goes_first_on_an_engine_that_schedules_by_priority():
    from macaron_ray.core.engine_client import ROUTE_PRIORITY, SUMMARY_PRIORITY, EngineRequest
    from macaron_ray.engine.openai_http import request_body

    req = route_hop.route_request("a", "hi")
    assert req.priority == ROUTE_PRIORITY < EngineRequest(adapter="a", messages=[]).priority < SUMMARY_PRIORITY
    # vLLM rejects a priority unless its scheduler uses them: only sent where it does.
    assert "priority" not in request_body(req)
    assert request_body(req, priority=True)["priority"] == ROUTE_PRIORITY
    assert "priority" not in request_body(EngineRequest(adapter="a", messages=[]), priority=True)


def test_the_route_scaffold_is_whole_kv_blocks_so_the_prefix_cache_holds_all_of_it():
    """vLLM caches whole KV blocks only: a scaffold that ends inside a block is prefilled again, in
    part, on every route. The routing prompt is worded to end the scaffold on a block boundary."""
    import yaml
    from transformers import AutoTokenizer

    from macaron_ray.model.chat_template import load_chat_template
    from macaron_ray.model.prepare import prepare_base_model
    from macaron_ray.paths import PACKAGE_DIR

    tokenizer, template = AutoTokenizer.from_pretrained(prepare_base_model()), load_chat_template()

    def ids(text: str) -> list[int]:
        prompt = tokenizer.apply_chat_template(route_messages(text), chat_template=template, tokenize=False,
                                               continue_final_message=True)
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]

    a, b = ids("AAAA"), ids("BBBB zz")
    scaffold = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    profile = yaml.safe_load((PACKAGE_DIR.parent / "deployments" / "local-cpu.yaml").read_text())
    sizes = {v for v in _find(profile, "block_size")}
    assert sizes, "local-cpu.yaml names no block_size"
    for size in sizes:
        assert scaffold % size == 0, f"scaffold of {scaffold} tokens ends inside a {size}-token block"


def _find(node, key):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            else:
                yield from _find(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _find(v, key)
