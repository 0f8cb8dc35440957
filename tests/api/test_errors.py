# OpenAI-shaped errors with the right status codes, through the official SDK.
from __future__ import annotations

import openai
import pytest

from tests.api.conftest import sdk

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}]


def test_bad_key_is_401(app_client):
    with pytest.raises(openai.AuthenticationError) as exc:
        sdk(app_client, "flm-wrong").chat.completions.create(model="tiny", messages=MESSAGES)
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key"
    r = app_client.post("/v1/chat/completions", json={})
    assert r.status_code == 401
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_unknown_model_is_404(app_client, tenant):
    with pytest.raises(openai.NotFoundError) as exc:
        sdk(app_client, tenant.key).chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert exc.value.body["code"] == "model_not_found"
    assert exc.value.body["param"] == "model"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 17}, "n"),  # above the max_n setting (16)
        ({"n": 0}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"temperature": 3.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"min_tokens": 9}, "max_tokens": 3}, "min_tokens"),
    ],
)
def test_invalid_parameter_is_400_with_param(app_client, tenant, kwargs, param):
    client = sdk(app_client, tenant.key)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=MESSAGES, **kwargs)
    assert exc.value.status_code == 400
    assert exc.value.body["param"] == param
    assert exc.value.body["type"] == "invalid_request_error"


def test_context_length_exceeded_is_400(app_client, tenant):
    client = sdk(app_client, tenant.key)
    long = "x" * 5000  # > 4096 tokens with the byte tokenizer
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}])
    assert exc.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4090)
    assert exc.value.body["code"] == "context_length_exceeded"


def test_empty_messages_is_400(app_client, tenant):
    with pytest.raises(openai.BadRequestError) as exc:
        sdk(app_client, tenant.key).chat.completions.create(model="tiny", messages=[])
    assert exc.value.body["param"] == "messages"


def test_completion_rejects_out_of_vocab_ids(app_client, tenant):
    with pytest.raises(openai.BadRequestError) as exc:
        sdk(app_client, tenant.key).completions.create(
            model="tiny", prompt=[1, 2, 10**6], max_tokens=2
        )
    assert exc.value.body["param"] == "prompt"


def test_tenant_keys_cannot_use_admin_endpoints(app_client, tenant, make_tenant):
    headers = {"Authorization": f"Bearer {tenant.key}"}
    assert app_client.get("/v1/admin/tenants", headers=headers).status_code == 403
    assert app_client.get("/internal/workers", headers=headers).status_code == 403
    other = make_tenant()
    usage = app_client.get("/v1/usage", params={"tenant": other.name}, headers=headers)
    assert usage.status_code == 403 and usage.json()["error"]["code"] == "admin_key_required"
    admin = {"Authorization": f"Bearer {make_tenant(admin=True).key}"}
    listed = app_client.get("/v1/admin/tenants", headers=admin).json()["data"]
    assert {tenant.name, other.name} <= {t["tenant"] for t in listed}
    missing = app_client.get("/v1/usage", params={"tenant": "no-such-tenant"}, headers=admin)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "tenant"
