# The operator's CLI against a running `fleetlm serve`: tenants, limits and keys; prices and the
# invoice that `fleetlm usage` prints from metered rows.
import json
import subprocess
import uuid

import httpx

from tests.e2e.conftest import CLI, ROOT
from tests.e2e.test_usage import complete


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_tenants_limits_and_keys(server):
    name = _name("cli")
    first = server.create_tenant(name, "--tpm", "1000", "--max-concurrency", "2")
    listed = json.loads(server.cli("tenants", "list", "--json"))
    assert next(r for r in listed if r["tenant"] == name)["active_keys"] == 1

    def limits() -> dict:
        rows = json.loads(server.cli("tenants", "limits", name, "--json"))
        return {r["priority"]: (r["max_concurrency"], r["tokens_per_minute"]) for r in rows}

    assert limits()["interactive"] == (2, 1000)
    server.cli("tenants", "limits", name, "--batch-tpm", "500", "--batch-max-concurrency", "1")
    assert limits() == {"interactive": (2, 1000), "batch": (1, 500)}
    assert name in server.cli("tenants", "limits")  # the table of every tenant

    second = json.loads(server.cli("tenants", "create-key", name, "--json"))["api_key"]
    assert second != first
    lines = server.cli("tenants", "keys", name).strip().splitlines()
    prefixes = [line.split("…")[0] for line in lines]
    assert len(prefixes) == 2 and all(line.split("…")[1].split()[0] == "active" for line in lines)
    assert {p for p in prefixes if first.startswith(p)} and {
        p for p in prefixes if second.startswith(p)
    }
    revoked = next(p for p in prefixes if first.startswith(p))
    server.cli("tenants", "revoke-key", revoked)
    states = {line.split("…")[0]: line.split("…")[1].split()[0] for line in
              server.cli("tenants", "keys", name).strip().splitlines()}  # fmt: skip
    assert states[revoked] == "revoked" and list(states.values()).count("active") == 1


def test_prices_apply_to_the_invoice(server):
    name = _name("bill")
    key = server.create_tenant(name)
    # Per million tokens: 1.00 input, 0.50 cached input, 2.00 output → 1, 0.5 and 2 micro-units
    # per token.
    server.cli("prices", "set", "tiny", "--input", "1", "--cached-input", "0.5", "--output", "2")
    assert "tiny" in server.cli("prices", "list")
    ids = [complete(server, key, max_tokens=4) for _ in range(2)]
    server.usage_rows(ids)
    report = json.loads(server.cli("usage", "--tenant", name, "--json", "--group-by", "model"))
    (line,) = report["lines"]
    assert line["requests"] == 2 and line["completion_tokens"] == 8
    rows = server.query(
        "SELECT prompt_tokens, cached_tokens, completion_tokens, cost_micros FROM usage_records"
        " WHERE request_id = ANY(:ids)",
        ids=ids,
    )
    for prompt, cached, completion, cost in rows:
        half_up = (cached + 1) // 2  # 0.5 micro-units per cached token, rounded half up
        assert cost == (prompt - cached) + half_up + 2 * completion
    assert line["cost_micros"] == sum(r[3] for r in rows)
    csv = server.cli("usage", "--tenant", name, "--csv", "--group-by", "model").splitlines()
    assert csv[0].startswith("model,requests,") and csv[1].startswith("tiny,2,")
    table = server.cli("usage", "--tenant", name, "--group-by", "model")
    assert "total" in table and "over 2 requests" in table


def test_tenant_names_have_a_charset_and_a_length(server):
    for bad in ("", "tenA ", "a\nb", "rtl\u202eevil", "n" * 250):
        out = subprocess.run(
            [*CLI, "tenants", "create", bad, "--data-dir", str(server.data_dir)],
            env=server.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0, repr(bad)
        assert "invalid tenant name" in out.stderr and "Traceback" not in out.stderr, out.stderr
    listed = {r["tenant"] for r in json.loads(server.cli("tenants", "list", "--json"))}
    assert not {n for n in listed if n != n.strip() or not n}


def test_tenants_create_prints_the_key_alone_on_stdout(server):
    """`KEY=$(fleetlm tenants create NAME)` keeps the key; the note about it goes to stderr."""
    out = subprocess.run(
        [*CLI, "tenants", "create", _name("cap"), "--data-dir", str(server.data_dir)],
        env=server.env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    key = out.stdout.strip()
    assert out.stdout == key + "\n" and key.startswith("flm-")
    assert "store it now" in out.stderr and key not in out.stderr
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.get(server.base_url + "/v1/models", headers=auth, timeout=30)
    assert r.status_code == 200, r.text  # the captured key is the key
