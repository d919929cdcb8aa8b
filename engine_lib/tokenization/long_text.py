"""Cut a very long text before tokenizing it, without changing its first max_length tokens."""
from __future__ import annotations

from tokenizers import Tokenizer

CUT_CHARS_PER_TOKEN = 32  # long texts are cut to this many characters per token of max_length


def cut_long_text(tokenizer: Tokenizer, text: str, max_length: int, keep_end: bool = False) -> str:
    """`text`, or a prefix of it whose first `max_length` tokens are the text's own
    (`keep_end`: a suffix whose last `max_length` tokens are, for truncation from the left).

    Tokenizing costs time linear in characters (seconds per MiB on a slow
    core) and truncation only happens after it, so a long text is cut to
    `max_length * CUT_CHARS_PER_TOKEN` characters first. The cut is kept only
    when the words before the cut word already give more than max_length
    tokens: normalizer and pre-tokenizer see local context only, so those
    tokens cannot change. Otherwise (e.g. mostly whitespace) the whole text is
    tokenized.
    """
    cut_chars = max_length * CUT_CHARS_PER_TOKEN
    if len(text) <= cut_chars:
        return text
    part = text[-cut_chars:] if keep_end else text[:cut_chars]
    words = [w for w in tokenizer.encode(part, add_special_tokens=False).word_ids if w is not None]
    cut_word = words[0] if keep_end else words[-1] if words else None  # the word the cut may have split
    if words and sum(w != cut_word for w in words) > max_length:
        return part
    return text
