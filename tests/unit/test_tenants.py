"""Tenant identity, accepted API keys and per-tenant cache salts, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config import ConfigError, ServerConfig
from cluster.policies.tenancy import (
    ANONYMOUS_TENANT,
    program_tenant,
    scoped_program_id,
    unscoped_program_id,
)
from deployments.api.tenants import ApiKeys, cache_salt, tenant_of
from deployments.errors import RequestRejected


def test_tenants_are_told_apart_by_api_key_without_storing_it() -> None:
    first = tenant_of("Bearer sk-one")
    assert first == tenant_of("Bearer sk-one") == tenant_of("bearer sk-one")
    assert first != tenant_of("Bearer sk-two")
    assert "sk-one" not in first
    assert tenant_of(None) == tenant_of("") == tenant_of("Bearer ") == ANONYMOUS_TENANT


def test_a_program_id_is_scoped_by_its_callers_key_and_anonymous_ids_stay_as_sent() -> None:
    one, two = tenant_of("Bearer sk-one"), tenant_of("Bearer sk-two")
    assert scoped_program_id(one, "agent-7") != scoped_program_id(two, "agent-7")
    assert scoped_program_id(one, "agent-7") == scoped_program_id(one, "agent-7")
    assert scoped_program_id(ANONYMOUS_TENANT, "agent-7") == "agent-7"


def _rejection(keys: ApiKeys, authorization: str | None) -> RequestRejected:
    with pytest.raises(RequestRejected) as rejected:
        keys.tenant(authorization)
    return rejected.value


def test_a_key_list_admits_its_keys_and_rejects_others_with_401() -> None:
    keys = ApiKeys.of(["sk-alpha-0001", "sk-beta-0002"])
    assert keys.tenant("Bearer sk-alpha-0001") == tenant_of("Bearer sk-alpha-0001")
    assert keys.tenant("Bearer sk-beta-0002") != keys.tenant("Bearer sk-alpha-0001")

    missing = _rejection(keys, None).error
    assert (missing.status, missing.code) == (401, "invalid_api_key")
    assert "Authorization" in missing.message
    unknown = _rejection(keys, "Bearer sk-gamma-secret-9999").error
    assert (unknown.status, unknown.code) == (401, "invalid_api_key")
    assert "sk-gamma-secret" not in unknown.message  # masked, as OpenAI does
    assert _rejection(keys, "Bearer ").error.status == 401


def test_without_a_key_list_every_caller_is_served_as_its_tenant() -> None:
    keys = ApiKeys()
    assert not keys.required
    assert keys.tenant(None) == ANONYMOUS_TENANT
    assert keys.tenant("Bearer anything") == tenant_of("Bearer anything")


def test_the_key_list_keeps_digests_only() -> None:
    keys = ApiKeys.of(["sk-alpha-0001"])
    assert all("sk-alpha" not in digest for digest in keys.digests)


def test_each_keyed_tenant_salts_its_prefix_cache_unless_shared() -> None:
    one, two = tenant_of("Bearer sk-one"), tenant_of("Bearer sk-two")
    assert cache_salt(one, None, shared_prefix_cache=False) != cache_salt(
        two, None, shared_prefix_cache=False
    )
    # A client's own salt cannot name another tenant's: it stays inside its own.
    spoofed = cache_salt(two, cache_salt(one, None, False), shared_prefix_cache=False)
    assert spoofed != cache_salt(one, None, shared_prefix_cache=False)
    assert cache_salt(ANONYMOUS_TENANT, None, shared_prefix_cache=False) is None
    assert cache_salt(ANONYMOUS_TENANT, "mine", shared_prefix_cache=False) not in (None, "mine")
    assert cache_salt(one, None, shared_prefix_cache=True) is None
    assert cache_salt(one, "mine", shared_prefix_cache=True) == "mine"


def test_api_keys_come_from_the_list_and_the_file(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# team keys\nsk-from-file-1\n\n  sk-from-file-2  \n")
    server = ServerConfig.model_validate({"api_keys": ["sk-inline"], "api_keys_file": keys_file})
    assert server.accepted_api_keys() == ["sk-inline", "sk-from-file-1", "sk-from-file-2"]
    assert "sk-inline" not in server.model_dump_json(), "keys are masked when dumped"
    assert ServerConfig().accepted_api_keys() == []
    with pytest.raises(ConfigError, match="api_keys_file"):
        ServerConfig(api_keys_file=tmp_path / "missing").accepted_api_keys()


def test_a_scoped_program_id_names_its_tenant() -> None:
    keyed = tenant_of("Bearer sk-one")
    assert program_tenant(scoped_program_id(keyed, "agent/7")) == keyed
    assert program_tenant(scoped_program_id(ANONYMOUS_TENANT, "agent-7")) == ANONYMOUS_TENANT
    assert program_tenant("team/agent-7") == ANONYMOUS_TENANT


def test_an_anonymous_callers_id_cannot_pass_for_a_keyed_tenants() -> None:
    keyed_id = scoped_program_id(tenant_of("Bearer sk-one"), "agent-7")
    as_anonymous = scoped_program_id(ANONYMOUS_TENANT, keyed_id)
    assert as_anonymous != keyed_id
    assert program_tenant(as_anonymous) == ANONYMOUS_TENANT
    assert unscoped_program_id(ANONYMOUS_TENANT, as_anonymous) == keyed_id
    assert unscoped_program_id(ANONYMOUS_TENANT, "team/agent-7") == "team/agent-7"


def test_the_command_prints_the_tenant_id_quotas_name_a_key_by(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from cluster.launch.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("sk-one\n\nsk-two\n"))
    assert main(["tenant-id"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [tenant_of("Bearer sk-one"), tenant_of("Bearer sk-two")]
