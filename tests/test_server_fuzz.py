"""Fuzzing the request parser through the whole app (in-process, starlette's TestClient) on the tiny synthetic
model: random JSON values in every field give 200 or a 400 naming that field, never a 500."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import write_model

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from ggufrun.server import CHAT_FIELDS, COMPLETION_FIELDS  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
BASE = {"/v1/chat/completions": {"messages": HI, "max_tokens": 3}, "/v1/completions": {"prompt": "hi", "max_tokens": 3}}

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()  # NaN and +-Infinity too: sent as JSON's non-standard literals
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "a\udfffb", "text", "none", "auto", "", "0", "1"])
)
keys = st.text(max_size=8) | st.integers(0, 300).map(str)  # token ids too, for logit_bias
json_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(sorted(CHAT_FIELDS | COMPLETION_FIELDS)) | st.text(min_size=1, max_size=10)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from starlette.testclient import TestClient

    import ggufrun
    from ggufrun.server import create_app

    path = write_model(tmp_path_factory.mktemp("fuzz") / "fuzz.gguf", tokenizer="bytes", ctx=96)
    model = ggufrun.load(path, n_ctx=96, n_threads=1)
    with TestClient(create_app(model, model_id="fuzz"), raise_server_exceptions=False) as c:
        yield c
    model.close()


def send(client, path: str, body: dict):
    return client.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def check(r, fields) -> None:
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["param"] in fields, r.text
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text, r.text
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(sorted(BASE)), field=field_names, value=json_values)
def test_one_random_field_gives_200_or_400_naming_it(client, path, field, value):
    r = send(client, path, {**BASE[path], field: value})
    check(r, {field})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(sorted(BASE)), body=st.dictionaries(field_names, json_values, max_size=6))
def test_random_bodies_give_200_or_400_naming_a_field(client, path, body):
    r = send(client, path, {**BASE[path], **body})
    check(r, set(body) | set(BASE[path]))
