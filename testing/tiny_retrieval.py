"""Random-weight retrieval folders (no hub), saved the way each reference library saves them:

- `save_bge_m3`: an XLM-R body with `sparse_linear.pt` and `colbert_linear.pt` beside it (FlagEmbedding's
  BGE-M3 layout);
- `save_splade`: a `BertForMaskedLM` under sentence-transformers' `SparseEncoder` (MLMTransformer +
  SpladePooling);

FlagEmbedding's M3 embedder is loaded by `flag_m3` (tests compare against it).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

from testing.tiny_models import perturb_, xlm_roberta_config
from testing.tiny_rerankers import CORPUS, _save_tokenizer, _word_tokenizer

WORDS = CORPUS + ["hybrid retrieval mixes dense sparse and late interaction vectors , with punctuation ! ? ."]


def save_bge_m3(folder, seed: int = 31, vocab_size: int = 128):
    """XLMRobertaModel + sparse_linear.pt (H -> 1) + colbert_linear.pt (H -> H), as FlagEmbedding saves them."""
    from tokenizers.processors import TemplateProcessing
    from transformers import XLMRobertaModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _word_tokenizer(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], vocab_size, WORDS)
    tokenizer.post_processor = TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                  special_tokens=[("<s>", 0), ("</s>", 2)])
    _save_tokenizer(tokenizer, folder, 128, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                    pad_token="<pad>", cls_token="<s>", sep_token="</s>", mask_token="<mask>")
    torch.manual_seed(seed)
    model = XLMRobertaModel(xlm_roberta_config(vocab_size=vocab_size), add_pooling_layer=False).eval()
    sparse, colbert = torch.nn.Linear(64, 1), torch.nn.Linear(64, 64)
    for module in (model, sparse, colbert):
        perturb_(module, seed)
    with torch.no_grad():
        sparse.bias.add_(0.3)  # about half the tokens get a positive weight (relu keeps them)
    model.save_pretrained(folder)
    torch.save(sparse.state_dict(), folder / "sparse_linear.pt")
    torch.save(colbert.state_dict(), folder / "colbert_linear.pt")
    return folder


def _bert_mlm(folder, seed: int, vocab_size: int):
    from tokenizers.processors import TemplateProcessing
    from transformers import BertConfig, BertForMaskedLM

    tokenizer = _word_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], vocab_size, WORDS)
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    _save_tokenizer(tokenizer, folder, 128, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                    sep_token="[SEP]", mask_token="[MASK]")
    config = BertConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128)
    torch.manual_seed(seed)
    model = BertForMaskedLM(config).eval()
    perturb_(model, seed)
    model.save_pretrained(folder)
    return model


def save_splade(folder, seed: int = 32, vocab_size: int = 128):
    """A SparseEncoder folder: MLMTransformer (BertForMaskedLM) + SpladePooling (max, relu)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    folder = Path(folder)
    hf = folder / "_hf"
    hf.mkdir(parents=True, exist_ok=True)
    _bert_mlm(hf, seed, vocab_size)
    transformer = MLMTransformer(str(hf), max_seq_length=128)
    encoder = SparseEncoder(modules=[transformer, SpladePooling(pooling_strategy="max",
                                                                word_embedding_dimension=vocab_size)],
                            device="cpu")
    encoder.save(str(folder))
    return folder


def flag_m3(folder, **kwargs):
    """FlagEmbedding's BGEM3FlagModel on `folder` (CPU, fp32).

    FlagEmbedding's package __init__ also imports its LLM rerankers, whose model files import
    transformers internals that transformers 5 removed; the M3 embedder itself needs none of
    them, so its modules are imported with their parent packages left empty."""
    if "FlagEmbedding.inference.embedder.encoder_only.m3" not in sys.modules:
        root = os.path.dirname(importlib.util.find_spec("FlagEmbedding").origin)
        for name in ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder",
                     "FlagEmbedding.inference.embedder.encoder_only", "FlagEmbedding.finetune"):
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules.setdefault(name, package)
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder

    return M3Embedder(str(folder), use_fp16=False, devices="cpu", normalize_embeddings=True, **kwargs)


COLBERT_PREFIXES = ("[Q] ", "[D] ")  # PyLate's default query and document prefixes, added as tokens


def save_colbert(folder, seed: int = 33, query_length: int = 16, document_length: int = 40, dim: int = 32,
                 attend_to_expansion_tokens: bool = False, do_query_expansion: bool = True):
    """A ColBERT folder as PyLate 1.6 saves one (pylate/models/colbert.py `save`, sentence-transformers 5.3
    modules): BertModel at the root with the prefix tokens added to its tokenizer (and vocabulary), the
    `[MASK]` token as pad token, a bias-free Dense projection in 1_Dense, PyLate's settings in
    config_sentence_transformers.json."""
    import json
    import string

    from safetensors.torch import save_file
    from tokenizers import AddedToken
    from tokenizers.processors import TemplateProcessing
    from transformers import BertConfig, BertModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _word_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], 128, WORDS)
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    tokenizer.add_tokens([AddedToken(p, normalized=True) for p in COLBERT_PREFIXES])
    _save_tokenizer(tokenizer, folder, 512, unk_token="[UNK]", pad_token="[MASK]", cls_token="[CLS]",
                    sep_token="[SEP]", mask_token="[MASK]")
    config = BertConfig(vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), hidden_size=64,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=False).eval()
    dense = torch.nn.Linear(64, dim, bias=False)
    for module in (model, dense):
        perturb_(module, seed)
    model.save_pretrained(folder)
    (folder / "1_Dense").mkdir(exist_ok=True)
    save_file({"linear.weight": dense.weight.detach().contiguous()}, str(folder / "1_Dense" / "model.safetensors"))
    files = {
        "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                         {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}],
        "sentence_bert_config.json": {"max_seq_length": document_length - 1, "do_lower_case": False},
        "1_Dense/config.json": {"in_features": 64, "out_features": dim, "bias": False,
                                "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False},
        "config_sentence_transformers.json": {
            "prompts": {"query": "", "document": ""}, "default_prompt_name": None, "similarity_fn_name": "MaxSim",
            "query_prefix": COLBERT_PREFIXES[0], "document_prefix": COLBERT_PREFIXES[1], "query_length": query_length,
            "document_length": document_length, "attend_to_expansion_tokens": attend_to_expansion_tokens,
            "skiplist_words": list(string.punctuation), "do_query_expansion": do_query_expansion}}
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2))
    return folder
