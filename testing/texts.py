"""Varied test texts: short, long past the 256-token limit, punctuation, CJK, emoji, accents."""
import random

_BASE = [
    "hello world",
    "a",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors so that similar meanings land close together.",
    "!!!???...;;;:::",
    "C'est déjà l'été: où est la crème brûlée?",
    "Ünïcödé façade naïve coöperate résumé",
    "東京は日本の首都です。",
    "机器学习是人工智能的一个分支。",
    "한국어 문장도 잘 처리되어야 합니다.",
    "Emoji time 🎉🚀🔥 with text 😀",
    "🙂",
    "Привет, как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "Ελληνικά γράμματα αβγδ",
    "tab\tseparated\tvalues",
    "line one\nline two\nline three",
    "   leading and trailing spaces   ",
    "URL: https://example.com/path?query=1&x=y#frag",
    "email someone@example.org about the meeting at 10:30",
    "Numbers 3.14159 2.71828 1e-9 -42 +7",
    "SELECT * FROM users WHERE id = 42;",
    "def f(x): return x ** 2  # python code",
    "<html><body><p>markup</p></body></html>",
    '{"json": [1, 2, 3], "nested": {"k": "v"}}',
    "ALL CAPS SHOUTING TEXT",
    "MiXeD cAsE tExT",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "The patient presented with acute myocardial infarction.",
    "Quantum chromodynamics describes the strong interaction.",
    "How do I reset my password?",
    "best pizza near me",
    "Vector databases store embeddings for nearest-neighbour search.",
    "Zürich, Genève, Bern, Lugano",
    "naïve Bayes vs. logistic regression",
    "¿Dónde está la biblioteca?",
    "Ça va très bien, merci!",
    "repeated repeated repeated repeated repeated",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "1234567890",
    "™ © ® ° ± × ÷ µ",
    "the",
    "Short query",
    "Kubernetes autoscaling with custom metrics",
    "Triton Inference Server ensembles chain models together.",
    "Le chat est sur la table.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "🇫🇷🇩🇪🇯🇵 flags",
]


def _long_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    vocab = ("search engine latency throughput vector token batch graph kernel memory "
             "index query document ranking model layer attention server client").split()
    return " ".join(rng.choice(vocab) for _ in range(words))


LONG_TEXTS = [_long_text(1, 400), _long_text(2, 300) + " 日本語 émoji 🎉", _long_text(3, 600)]
MEDIUM_TEXTS = [_long_text(10 + i, 20 + 15 * i) for i in range(8)]
VARIED_TEXTS = _BASE + MEDIUM_TEXTS + LONG_TEXTS
