"""Reranker families, chosen from config.json's `architectures` (no torch here: the tokenizer reads it too)."""
from __future__ import annotations

# architecture -> how pairs are presented: "cross-encoder" (the tokenizer's own pair template,
# one logit from a classification head) or "yes-no" (a causal LM judging the pair in a chat template).
SCORING_ARCHITECTURES = {
    "BertForSequenceClassification": "cross-encoder",
    "XLMRobertaForSequenceClassification": "cross-encoder",
    "Qwen3ForCausalLM": "yes-no",
}


def scoring_architecture(cfg: dict, path: str) -> str:
    found = [a for a in cfg.get("architectures") or [] if a in SCORING_ARCHITECTURES]
    if not found:
        raise ValueError(f"{path}: architectures {cfg.get('architectures')} names no reranker we serve; "
                         f"supported: {sorted(SCORING_ARCHITECTURES)}")
    return found[0]
