"""Schemathesis against the OpenAPI schema: generated requests, valid (positive) and invalid
(negative), to every operation; no answer may be a 5xx, and every error must be JSON with a
`detail` message. Bounded: a fixed number of examples per operation and mode, derandomised
(the same requests every run).

(schemathesis' own pytest plugin does not run under pytest 9, so the operations' hypothesis
strategies are driven here directly.)"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from service.api.auth import is_worker_route
from service.app import create_app
from service.settings import Settings
from tests.service.svchelp import ADMIN_TOKEN, AUTH_SETTINGS, WORKER_TOKEN

EXAMPLES = 20


@pytest.fixture(scope="module")
def api_schema(databases, backend):
    url = databases.fresh(backend)
    # short streams and waits: an event stream of a job nobody searches ends instead of hanging
    # auth on, as the service runs by default: every case carries the token its route takes
    app = create_app(Settings(database_url=url, sse_max_seconds=0.3, sse_poll_seconds=0.1,
                              resize_wait_max_seconds=0.2, allowed_hosts=["localhost", "testserver"], **AUTH_SETTINGS))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.slow  # hundreds of generated requests: ~8 s per mode
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_no_server_errors(api_schema, mode):
    ops = _operations(api_schema)
    assert len(ops) >= 15  # every route is in the schema
    problems: list[str] = []
    exercised = 0
    for op in ops:
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            token = WORKER_TOKEN if is_worker_route(case.path) else ADMIN_TOKEN
            response = case.call(headers={"Authorization": f"Bearer {token}"})
            where = f"{case.method} {case.formatted_path} -> {response.status_code}"
            assert response.status_code < 500, f"{where}: {response.text[:300]}"
            if response.status_code >= 400:
                body = response.json()
                assert isinstance(body.get("detail"), str) and body["detail"], f"{where}: {body}"

        try:
            check()
            exercised += 1
        except Unsatisfiable:  # nothing invalid to send to it (no parameters, no body)
            continue
        except AssertionError as e:
            exercised += 1
            problems.append(str(e).splitlines()[0])
    assert not problems, "\n".join(problems)
    assert exercised >= 12
