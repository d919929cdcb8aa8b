"""Bulk tool input parsing and the resumable output (no server)."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from rose_client.chunking import plan_chunks
from rose_client.inputs import read_input
from rose_client.store import ResumableOutput, ResumeMismatch

JOB = {"input_sha256": "x", "num_texts": 10, "chunk_plan": "p", "parameters": {"normalize": True}}
CHUNKS = plan_chunks([1] * 10, max_chunk_tokens=3, max_chunk_texts=10)  # 4 chunks


def rows_of(chunk):
    return np.arange(chunk.start * 4, chunk.stop * 4, dtype=np.float32).reshape(-1, 4)


def test_text_and_jsonl_inputs(tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("first\nsecond ünï\n")
    job = read_input(str(text))
    assert (job.texts, job.ids) == (["first", "second ünï"], ["0", "1"])
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"id": "a", "text": "x"}\n{"body": "y"}\n')
    with pytest.raises(ValueError, match=r"in.jsonl:2: expected an object with a string field 'text'"):
        read_input(str(jsonl))
    jsonl.write_text('{"id": "a", "text": "x"}\n{"text": "y"}\n')
    assert read_input(str(jsonl)).ids == ["a", "1"]
    text.write_text("ok\n\nok\n")
    with pytest.raises(ValueError, match=r"in.txt:2: empty text"):
        read_input(str(text))


def test_interrupted_output_resumes_with_finished_chunks(tmp_path):
    out = str(tmp_path / "v.npy")
    first = ResumableOutput(out, JOB)
    assert first.open() == set()
    for chunk in (CHUNKS[0], CHUNKS[2]):
        first.write(chunk, rows_of(chunk))
    first.close()
    with open(out + ".journal", "a") as journal:
        journal.write('{"chunk": 3')  # a line cut off by the interruption
    second = ResumableOutput(out, JOB)
    assert second.open() == {0, 2}
    for chunk in (CHUNKS[1], CHUNKS[3]):
        second.write(chunk, rows_of(chunk))
    second.finish([str(i) for i in range(10)])
    np.testing.assert_array_equal(np.load(out), np.arange(40, dtype=np.float32).reshape(10, 4))
    assert not (tmp_path / "v.npy.journal").exists() and not (tmp_path / "v.npy.partial.npy").exists()


def test_journal_of_another_job_is_refused(tmp_path):
    out = str(tmp_path / "v.npy")
    first = ResumableOutput(out, JOB)
    first.open()
    first.write(CHUNKS[0], rows_of(CHUNKS[0]))
    first.close()
    with pytest.raises(ResumeMismatch, match=r"differs in \['parameters'\]"):
        ResumableOutput(out, {**JOB, "parameters": {"normalize": False}}).open()


def test_parquet_has_ids_and_rows(tmp_path):
    out = str(tmp_path / "v.parquet")
    output = ResumableOutput(out, JOB)
    output.open()
    for chunk in CHUNKS:
        output.write(chunk, rows_of(chunk))
    output.finish([f"doc{i}" for i in range(10)])
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [f"doc{i}" for i in range(10)]
    np.testing.assert_array_equal(np.array(table.column("embedding").to_pylist()),
                                  np.arange(40).reshape(10, 4))
    assert table.schema.field("embedding").type.list_size == 4
