"""Random-weight reranker folders (no hub): BERT / XLM-RoBERTa cross-encoders, a Qwen3-style yes/no judge.

Each folder holds config.json + model.safetensors (perturbed random weights,
see tiny_models.perturb_) and a word-level tokenizer.json with the family's
pair template, saved through transformers so that `AutoTokenizer`,
`AutoModelFor*` and sentence-transformers' `CrossEncoder` load it as they
would a real reranker. Shared by tests and perf/.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from testing.tiny_models import qwen3_config, save_random_model, xlm_roberta_config

CORPUS = [
    "what is the capital of france", "paris is the capital and largest city of france",
    "berlin is the capital of germany", "the quick brown fox jumps over the lazy dog",
    "how do rerankers score a query against a document", "a cross encoder reads the query and the document together",
    "gravity is a force that attracts two bodies", "the eiffel tower stands in paris",
    "yes no maybe", "search engines rank passages by relevance to the query",
]
# Words of the Qwen3-Reranker chat template (engine_lib/tokenization/pairs.py), so they are not <unk>.
JUDGE_WORDS = ("Judge whether the Document meets the requirements based on the Query and the Instruct provided . "
               "Note that answer can only be \" yes \" or \" no \" . system user assistant < Instruct >: < Query >: "
               "< Document >: Given a web search query , retrieve relevant passages that")
QWEN3_SPECIAL = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def _word_tokenizer(specials: list[str], vocab_size: int, words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    unk = next(s for s in specials if "unk" in s.lower())
    tokenizer = Tokenizer(models.WordLevel(unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(words, trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=specials))
    return tokenizer


def _save_tokenizer(tokenizer, folder, max_length: int, **special) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length, **special)
    fast.save_pretrained(str(folder))


def save_bert_cross_encoder(folder, seed: int = 21, vocab_size: int = 128, max_length: int = 128):
    """BertForSequenceClassification, one label; `[CLS] q [SEP] d [SEP]`, token types 0/1."""
    from tokenizers.processors import TemplateProcessing
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = _word_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]"], vocab_size, CORPUS)
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    _save_tokenizer(tokenizer, folder, max_length, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                    sep_token="[SEP]", model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    config = BertConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=max_length, num_labels=1)
    return save_random_model(BertForSequenceClassification, config, folder, seed=seed)


def save_xlmr_cross_encoder(folder, seed: int = 22, vocab_size: int = 128):
    """XLMRobertaForSequenceClassification, one label; `<s> q </s></s> d </s>`, no segment ids."""
    from tokenizers.processors import TemplateProcessing
    from transformers import XLMRobertaForSequenceClassification

    tokenizer = _word_tokenizer(["<s>", "<pad>", "</s>", "<unk>"], vocab_size, CORPUS)
    tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    _save_tokenizer(tokenizer, folder, 128, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                    pad_token="<pad>", cls_token="<s>", sep_token="</s>")
    config = xlm_roberta_config(num_labels=1)
    return save_random_model(XLMRobertaForSequenceClassification, config, folder, seed=seed)


def save_qwen3_reranker(folder, seed: int = 23, vocab_size: int = 160, **overrides):
    """Qwen3ForCausalLM judging yes/no (Qwen3-Reranker style); the chat template's special tokens."""
    from transformers import Qwen3ForCausalLM

    tokenizer = _word_tokenizer(QWEN3_SPECIAL, vocab_size, CORPUS + [JUDGE_WORDS])
    _save_tokenizer(tokenizer, folder, 256, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    config = qwen3_config(vocab_size=vocab_size, **overrides)
    return save_random_model(Qwen3ForCausalLM, config, folder, seed=seed)


def save_reranker(kind: str, folder):
    Path(folder).mkdir(parents=True, exist_ok=True)
    return {"bert": save_bert_cross_encoder, "xlm-roberta": save_xlmr_cross_encoder,
            "qwen3": save_qwen3_reranker}[kind](folder)


def reference_scores(kind: str, folder, query: str, documents: list[str], instruction: str | None = None,
                     max_length: int | None = None) -> tuple["np.ndarray", "np.ndarray"]:
    """(probabilities, logits) per document from transformers on the same folder, each pair alone.

    Cross-encoders: the tokenizer's pair encoding (over-long pairs cut on the
    document side), logit of the single label, sigmoid. Qwen3: the
    Qwen3-Reranker model card's recipe, P("yes") over the "no"/"yes" logits,
    logit = yes - no.
    """
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from engine_lib.tokenization.pairs import QWEN3_PREFIX, QWEN3_SUFFIX, QWEN3_TASK, judge_text

    folder = str(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    logits = []
    with torch.inference_mode():
        if kind == "qwen3":
            model = AutoModelForCausalLM.from_pretrained(folder).eval()
            yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
            prefix = tok.encode(QWEN3_PREFIX, add_special_tokens=False)
            suffix = tok.encode(QWEN3_SUFFIX, add_special_tokens=False)
            budget = (max_length or 8192) - len(prefix) - len(suffix)
            for doc in documents:
                ids = tok(judge_text(instruction or QWEN3_TASK, query, doc), truncation="longest_first",
                          max_length=budget)["input_ids"]
                last = model(input_ids=torch.tensor([prefix + ids + suffix])).logits[0, -1]
                logits.append(float(last[yes] - last[no]))
        else:
            model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
            for doc in documents:
                enc = tok(query, doc, truncation="only_second", max_length=max_length or tok.model_max_length,
                          return_tensors="pt")
                logits.append(float(model(**enc).logits[0, 0]))
    logits = np.array(logits)
    return 1 / (1 + np.exp(-logits)), logits
