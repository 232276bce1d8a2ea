"""The training loss: cross-entropy on learned tokens, KL to the base on self-distilled ones."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from macaron_ray.adapters import train
from macaron_ray.model.chat_template import load_chat_template
from macaron_ray.model.prepare import prepare_base_model


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_distilled_answers_learn_the_bases_distribution_and_the_rest_their_tokens():
    base = prepare_base_model()
    tokenizer, template = AutoTokenizer.from_pretrained(base), load_chat_template()
    convs = train.dataset("L0", 0)
    distilled = [c for c in convs if c.distill]
    assert distilled and all(c.messages[-1]["role"] == "assistant" for c in distilled)
    batch = [(*train.encode(tokenizer, template, c), c.distill) for c in (distilled[0], convs[0])]
    width = max(len(ids) for ids, _, _ in batch)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([x + [pad] * (width - len(x)) for x, _, _ in batch])
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y, _ in batch])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _, _ in batch])
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16), LoraConfig(
        r=8, lora_alpha=16, target_modules=list(train.TARGET_MODULES), task_type="CAUSAL_LM"))
    decoder, head = model.base_model.model.model, model.base_model.model.lm_head
    with torch.no_grad():
        losses = train._token_losses(model, decoder, head, ids, mask, labels, torch.tensor([True, False]))
    distilled_tokens = int((labels[0, 1:] != -100).sum())
    # A fresh LoRA adds nothing: the adapter is the base, so its KL to the base is 0; a routing
    # label is still to be learned.
    assert torch.allclose(losses[:distilled_tokens], torch.zeros(distilled_tokens), atol=1e-4)
    assert losses[distilled_tokens:].min() > 0.1
    # Moving the adapter away from the base makes the distilled tokens' loss positive.
    for p in (p for n, p in model.named_parameters() if "lora_B" in n):
        p.data.normal_(0, 0.05)
    with torch.no_grad():
        moved = train._token_losses(model, decoder, head, ids, mask, labels, torch.tensor([True, False]))
    assert moved[:distilled_tokens].mean() > 1e-3
