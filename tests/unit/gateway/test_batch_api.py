"""The Batch API's HTTP side without Triton (the app in process, no runner started): the limits and
every refused field answer with a status and a message naming the problem; keys own their ids;
no --data-dir, no Batch API. The whole flow with a real server: tests/e2e/test_batch_e2e.py."""
import asyncio
import json

import httpx
import pytest

from gateway.app import create_app
from gateway.config import GatewayConfig

KEYS = ("key-a", "key-b")


def call(tmp_path, scenario, **config):
    async def main():
        settings = {"data_dir": str(tmp_path / "data"), "api_keys": frozenset(KEYS), **config}
        app = create_app(GatewayConfig(triton=("fake:1",), **settings))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            return await scenario(client)
    return asyncio.run(main())


def auth(key=KEYS[0]):
    return {"Authorization": f"Bearer {key}"}


def jsonl(count, size=10):
    return "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings",
                               "body": {"model": "m", "input": "x" * size}}) + "\n" for i in range(count)).encode()


async def upload(client, content, purpose="batch", key=KEYS[0], name="in.jsonl"):
    return await client.post("/v1/files", files={"file": (name, content)}, data={"purpose": purpose},
                             headers=auth(key))


def error(response, status):
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_uploads_past_the_limits_are_refused_by_name(tmp_path):
    async def scenario(client):
        ok = await upload(client, jsonl(2))
        assert ok.status_code == 200 and ok.json()["bytes"] == len(jsonl(2)) and ok.json()["purpose"] == "batch"
        too_many = error(await upload(client, jsonl(3)), 400)
        assert "3 requests" in too_many["message"] and too_many["param"] == "file"
        too_big = error(await upload(client, jsonl(1, 600)), 413)
        assert "at most 500" in too_big["message"] and too_big["param"] == "file"
        assert error(await upload(client, jsonl(1), purpose="fine-tune"), 400)["param"] == "purpose"
        assert "no requests" in error(await upload(client, b"\n  \n"), 400)["message"]
        no_file = await client.post("/v1/files", data={"purpose": "batch"}, files={"other": ("x", b"1")},
                                    headers=auth())
        assert error(no_file, 400)["param"] == "file"
        not_form = await client.post("/v1/files", json={"purpose": "batch"}, headers=auth())
        assert "multipart/form-data" in error(not_form, 400)["message"]
        assert error(await client.get("/v1/files"), 401)["code"] == "invalid_api_key"
        await upload(client, jsonl(1))
        full = error(await upload(client, jsonl(1)), 429)
        assert "at most 2" in full["message"]
        other = await upload(client, jsonl(1), key=KEYS[1])  # the other key has room of its own
        assert other.status_code == 200

    call(tmp_path, scenario, batch_max_file_lines=2, batch_max_file_bytes=500, batch_max_files_per_key=2)


def test_batches_refuse_bad_fields_and_other_keys_ids(tmp_path):
    async def scenario(client):
        file_id = (await upload(client, jsonl(2))).json()["id"]
        good = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
        for change, param in (({"endpoint": "/v1/chat/completions"}, "endpoint"),
                              ({"completion_window": "1h"}, "completion_window"),
                              ({"metadata": {"k": 1}}, "metadata"),
                              ({"output_expires_after": {"anchor": "created_at", "seconds": 60}},
                               "output_expires_after"),
                              ({"input_file_id": None}, "input_file_id"), ({"temperature": 1}, "temperature")):
            refused = await client.post("/v1/batches", json={**good, **change}, headers=auth())
            assert error(refused, 400)["param"] == param, change
        theirs = await client.post("/v1/batches", json=good, headers=auth(KEYS[1]))
        assert error(theirs, 404)["param"] == "input_file_id"
        created = await client.post("/v1/batches", json={**good, "metadata": {"run": "1"},
                                                         "output_expires_after": {"anchor": "created_at",
                                                                                  "seconds": 3600}},
                                    headers=auth())
        batch = created.json()
        assert created.status_code == 200 and batch["status"] == "validating" and batch["metadata"] == {"run": "1"}
        assert set(batch) >= {"id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status",
                              "output_file_id", "error_file_id", "created_at", "in_progress_at", "expires_at",
                              "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
                              "cancelled_at", "request_counts", "metadata"}
        assert "output_expires_after_s" not in batch
        assert error(await client.post("/v1/batches", json=good, headers=auth()), 429)["code"] == \
            "batch_limit_exceeded"
        for method, path in (("GET", f"/v1/batches/{batch['id']}"), ("POST", f"/v1/batches/{batch['id']}/cancel"),
                             ("GET", f"/v1/files/{file_id}/content"), ("DELETE", f"/v1/files/{file_id}")):
            assert error(await client.request(method, path, headers=auth(KEYS[1])), 404)["code"] == "not_found"
        listed = (await client.get("/v1/batches", headers=auth(KEYS[1]))).json()
        assert listed == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
        cancelled = await client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth())
        assert cancelled.json()["status"] == "cancelling"
        content = await client.get(f"/v1/files/{file_id}/content", headers=auth())
        assert content.content == jsonl(2)
        assert error(await client.get("/v1/batches?limit=0", headers=auth()), 400)["param"] == "limit"

    call(tmp_path, scenario, batch_max_active_per_key=1)


def test_without_a_data_folder_there_is_no_batch_api(tmp_path):
    async def scenario(client):
        return await client.get("/v1/files", headers=auth())

    assert error(call(tmp_path, scenario, data_dir=""), 404)["code"] == "batch_api_off"


def test_a_folder_that_cannot_hold_the_store_stops_the_gateway_naming_it(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="--data-dir .*/file/data"):
        create_app(GatewayConfig(triton=("fake:1",), data_dir=str(tmp_path / "file" / "data")))
