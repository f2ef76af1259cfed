"""`make bench-web` reads wrk's report: rates, percentiles in any unit, and errors that make a
run invalid."""

from __future__ import annotations

import pytest

from devtools.web_bench import lua_script, parse_wrk

REPORT = """Running 10s test @ http://127.0.0.1:18081
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    30.12ms   10.01ms 120.00ms   80.00%
    Req/Sec   540.00     50.00   600.00     70.00%
  Latency Distribution
     50%  {p50}
     75%   35.00ms
     90%   45.00ms
     99%  {p99}
  10800 requests in 10.00s, 3.00MB read
{extra}Requests/sec:   1080.50
Transfer/sec:    307.20KB
"""


def test_rate_percentiles_and_units_are_read() -> None:
    result = parse_wrk(REPORT.format(p50="850.00us", p99="1.20s", extra=""))
    assert result.requests_per_s == 1080.5
    assert result.requests == 10800
    assert result.p50_ms == pytest.approx(0.85)
    assert result.p99_ms == pytest.approx(1200.0)
    assert result.errors == 0


def test_non_2xx_answers_and_socket_errors_count_as_errors() -> None:
    extra = (
        "  Socket errors: connect 0, read 2, write 0, timeout 3\n  Non-2xx or 3xx responses: 7\n"
    )
    result = parse_wrk(REPORT.format(p50="1.00ms", p99="9.00ms", extra=extra))
    assert result.errors == 12


def test_a_report_without_its_figures_is_refused() -> None:
    with pytest.raises(ValueError, match="Requests/sec"):
        parse_wrk("unable to connect to 127.0.0.1:18081 Connection refused")


def test_the_request_script_sends_every_path_with_the_token() -> None:
    script = lua_script(["/a", "/b"], "tok")
    assert '"/a",\n"/b"' in script
    assert '["Authorization"] = "Bearer tok"' in script


def test_the_request_script_for_console_pages_sends_the_session_cookie_not_the_token() -> None:
    script = lua_script(["/"], "tok", "session=abc")
    assert '["Cookie"] = "session=abc"' in script
    assert "Bearer" not in script
