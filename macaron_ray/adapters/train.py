"""Train the four specialist adapters on CPU with peft: the project's own recipe.

`train_all` rebuilds `macaron_ray/adapters/built/` deterministically from the
seed: the data generators are pure, torch is seeded and pinned to a fixed
thread count, and batches come in a seeded order. Each adapter learns only its
last assistant message (prompt tokens are masked out of the loss). Weights are
stored in bf16 with a manifest (`manifest.py`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from macaron_ray.adapters import agent_data, answer_data, coding_distill, ui_data
from macaron_ray.adapters.answer_data import Conversation
from macaron_ray.adapters.manifest import (
    BUILT_DIR, RECIPE_VERSION, AdapterEntry, BaseInfo, Manifest, file_sha256,
)
from macaron_ray.model.chat_template import load_chat_template
from macaron_ray.model.prepare import SMOLLM2_135M

logger = logging.getLogger(__name__)

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
THREADS = 2


@dataclass(frozen=True)
class Recipe:
    label: str
    adapter_id: str
    rank: int
    alpha: int
    lr: float
    epochs: int
    batch_size: int


RECIPES: dict[str, Recipe] = {
    "L0": Recipe("L0", "mol-l0-chat-router", rank=8, alpha=16, lr=1e-3, epochs=2, batch_size=16),
    "L1": Recipe("L1", "mol-l1-personal-agent", rank=8, alpha=16, lr=1e-3, epochs=2, batch_size=8),
    "L2": Recipe("L2", "mol-l2-coding", rank=8, alpha=16, lr=1e-3, epochs=2, batch_size=8),
    "L3": Recipe("L3", "mol-l3-generative-ui", rank=8, alpha=16, lr=1e-3, epochs=2, batch_size=8),
}


ROUTE_EXAMPLES_PER_LABEL = 600
"""Generator requests per label in L0's routing data (recipe 14; 400 before): more draws of the
training frames, slot values and wrappers."""

CHAT_EXAMPLES = 10_000
"""L0's chat examples: all of them (authored and distilled)."""

AGENT_FUNCTION_EXAMPLES = 900
"""L1's authored functions (`agent_data.SHAPES`): calls, two calls, tool results, no call needed."""

UI_DATA_EXAMPLES = 480
"""L3's requests that name their data (`ui_data`), eight languages, one in four a form."""


def dataset(label: str, seed: int) -> list[Conversation]:
    """The training conversations of one adapter."""
    if label == "L0":
        return (answer_data.route_conversations(ROUTE_EXAMPLES_PER_LABEL, seed)
                + answer_data.chat_conversations(CHAT_EXAMPLES, seed)
                + answer_data.chat_after_notes() + answer_data.summary_conversations(384, seed))
    if label == "L1":
        # The eight assistant tools, and the authored functions of every shape (calls among other
        # functions, two calls, tool results answered in words), each checked against its schema.
        convs = answer_data.agent_conversations(240, seed) + agent_data.conversations(AGENT_FUNCTION_EXAMPLES, seed)
        return answer_data.with_past_turns(convs, label, seed)
    if label == "L2":
        # Python: only answers that passed their task's tests (verified self-distillation); the
        # authored snippets keep the other languages.
        snippets = [c for c in answer_data.coding_conversations(160, seed)
                    if "```python" not in c.messages[-1]["content"]]
        return coding_distill.conversations() + snippets
    if label == "L3":
        # The component kinds, and requests that name their data (checked: the block carries it).
        convs = answer_data.ui_conversations(160, seed) + ui_data.conversations(UI_DATA_EXAMPLES, seed)
        return answer_data.with_past_turns(convs, label, seed)
    raise ValueError(f"unknown label {label!r}")


def data_sha256(convs: list[Conversation]) -> str:
    blob = json.dumps([[c.messages, c.tools, *(["distill"] if c.distill else [])] for c in convs],
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def encode(tokenizer, template: str, conv: Conversation) -> tuple[list[int], list[int]]:
    """(input ids, labels) with everything but the last assistant message masked (-100)."""
    kwargs = {"chat_template": template, "tools": conv.tools, "tokenize": False}
    full = tokenizer.apply_chat_template(conv.messages, **kwargs)
    prompt = tokenizer.apply_chat_template(conv.messages[:-1], add_generation_prompt=True, **kwargs)
    assert full.startswith(prompt), "chat template is not append-only"
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tokenizer(full[len(prompt):].rstrip("\n"), add_special_tokens=False)["input_ids"]
    return p_ids + a_ids, [-100] * len(p_ids) + a_ids


def _token_losses(model, decoder, lm_head, ids, mask, labels, distill):
    """Per learned token: cross-entropy, or for rows marked `distill` the KL divergence from the
    base (the same model with the adapter off) to the adapter."""
    import torch
    import torch.nn.functional as F

    targets = labels[:, 1:]
    keep = targets != -100
    hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
    # Project only the positions that predict a learned token: the vocabulary
    # projection of every prompt position is most of the step's cost otherwise.
    logits = lm_head(hidden[:, :-1][keep]).float()
    losses = F.cross_entropy(logits, targets[keep], reduction="none")
    rows = distill[:, None].expand_as(targets)[keep]
    if rows.any():
        with torch.no_grad(), model.disable_adapter():
            base_hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
            base = F.log_softmax(lm_head(base_hidden[:, :-1][keep][rows]).float(), dim=-1)
        kl = (base.exp() * (base - F.log_softmax(logits[rows], dim=-1))).sum(-1)
        losses = losses.masked_scatter(rows, kl)
    return losses


def _length_bucketed_batches(encoded: list, batch_size: int, rng: random.Random) -> list[list]:
    """Seeded batches of similar lengths (little padding), in a seeded order."""
    idx = list(range(len(encoded)))
    rng.shuffle(idx)
    idx.sort(key=lambda i: len(encoded[i][0]))
    batches = [[encoded[i] for i in idx[b:b + batch_size]] for b in range(0, len(idx), batch_size)]
    rng.shuffle(batches)
    return batches


def train_adapter(label: str, base_dir: Path, out_dir: Path, seed: int) -> AdapterEntry:
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = RECIPES[label]
    torch.manual_seed(seed)
    torch.set_num_threads(THREADS)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    template = load_chat_template()
    convs = dataset(label, seed)
    encoded = [(*encode(tokenizer, template, c), c.distill) for c in convs]

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(
        r=recipe.rank, lora_alpha=recipe.alpha, lora_dropout=0.0,
        target_modules=list(TARGET_MODULES), task_type="CAUSAL_LM",
    ))
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    order = random.Random(f"{seed}:{label}:order")
    steps_per_epoch = (len(encoded) + recipe.batch_size - 1) // recipe.batch_size
    total = steps_per_epoch * recipe.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / 10) * max(0.05, 1 - s / total))
    pad = tokenizer.pad_token_id
    model.train()
    decoder, lm_head = model.base_model.model.model, model.base_model.model.lm_head
    step, started = 0, time.monotonic()
    for epoch in range(recipe.epochs):
        for batch in _length_bucketed_batches(encoded, recipe.batch_size, order):
            width = max(len(ids) for ids, _, _ in batch)
            ids = torch.tensor([x + [pad] * (width - len(x)) for x, _, _ in batch])
            labels = torch.tensor([y + [-100] * (width - len(y)) for _, y, _ in batch])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _, _ in batch])
            distill = torch.tensor([d for _, _, d in batch])
            loss = _token_losses(model, decoder, lm_head, ids, mask, labels, distill).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optim.step()
            sched.step()
            optim.zero_grad()
            step += 1
            if step % 10 == 0 or step == total:
                logger.info("%s step %d/%d loss %.4f (%.1f s)", label, step, total, loss.item(),
                            time.monotonic() - started)

    target = out_dir / label
    if target.exists():
        shutil.rmtree(target)
    model.save_pretrained(target, safe_serialization=True)
    weights = target / "adapter_model.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(weights).items()}, weights)
    cfg_path = target / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = SMOLLM2_135M.name  # never a local path
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return AdapterEntry(
        label=label, adapter_id=recipe.adapter_id, path=label, rank=recipe.rank, alpha=recipe.alpha,
        target_modules=list(TARGET_MODULES), data_sha256=data_sha256(convs),
        weights_sha256=file_sha256(weights), examples=len(convs), steps=step,
    )


def train_all(base_dir: Path, out_dir: Path = BUILT_DIR, seed: int = 0,
              labels: tuple[str, ...] = tuple(RECIPES)) -> Manifest:
    """Train `labels` into a staging copy of out_dir, then swap it in with a fresh manifest."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".built-", dir=out_dir.parent))
    try:
        if out_dir.exists():
            shutil.copytree(out_dir, staging, dirs_exist_ok=True)
        old = Manifest.load(staging) if (staging / "manifest.json").exists() else None
        entries = {e.label: e for e in old.adapters} if old else {}
        for label in labels:
            entries[label] = train_adapter(label, base_dir, staging, seed)
        manifest = Manifest(
            recipe_version=RECIPE_VERSION, seed=seed,
            base=BaseInfo(name=SMOLLM2_135M.name, gguf_sha256=SMOLLM2_135M.gguf_sha256,
                          weights_sha256=file_sha256(base_dir / "model.safetensors")),
            adapters=[entries[k] for k in sorted(entries)],
        )
        manifest.write(staging)
        backup = out_dir.with_name(out_dir.name + ".old")
        if out_dir.exists():
            out_dir.rename(backup)
        staging.chmod(0o755)  # mkdtemp makes it private
        staging.rename(out_dir)
        shutil.rmtree(backup, ignore_errors=True)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)
