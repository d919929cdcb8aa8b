"""tokenize_group: one result per request, in order; a failing step fails the whole group with
an error that names it."""
from __future__ import annotations

from engine_lib.errors import InputError
from engine_lib.tokenization.grouped import tokenize_group


def test_each_request_gets_its_own_result_in_order():
    def many(requests):
        return [InputError(f"{t} is bad", "TEXT") if t.startswith("bad") else {"ids": t} for t, _ in requests]

    results = tokenize_group(many, [("a", None), ("bad b", None), ("c", None)])
    assert results[0] == {"ids": "a"} and results[2] == {"ids": "c"}
    assert isinstance(results[1], InputError) and "bad b is bad" in str(results[1])


def test_a_failing_step_answers_every_request_with_the_error():
    def broken(requests):
        raise ValueError("tokenizer blew up")

    results = tokenize_group(broken, [("a", None), ("b", None)])
    assert len(results) == 2 and all("tokenizer blew up" in str(r) for r in results)


def test_a_step_that_loses_a_result_fails_the_group_rather_than_misanswer():
    results = tokenize_group(lambda requests: [{"ids": 1}], [("a", None), ("b", None)])
    assert len(results) == 2 and all("gave 1 results for 2 requests" in str(r) for r in results)
