"""`stable-prefix doctor`: the pinned clients against what their registries serve, asked with the real npm
and pip, of a registry on 127.0.0.1 that serves what the test says (or of none at all).

The registry answers npm's package documents (`GET /<name>`: dist-tags and each
version's `engines`) and a PEP 503 simple index for pip (`GET /simple/<name>/`),
for every pinned package, the newest one release ahead of the pin.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator

import pytest

from stable_prefix import pins
from stable_prefix.agents.roster import AGENTS
from tests.support.processes import LOOPBACK, REPO_ROOT, VENV_BIN, free_port

NEWER = "99.0.0"
NODE_OF_NEWER = ">=24"
AGENT_PINS = tuple(agent.pin for agent in AGENTS)  # each record carries its own


def npm_document(pin: pins.Pin) -> dict:
    versions = {pin.version: {"name": pin.package, "version": pin.version, "engines": {"node": ">=20"}},
                NEWER: {"name": pin.package, "version": NEWER, "engines": {"node": NODE_OF_NEWER}}}
    return {"name": pin.package, "dist-tags": {"latest": NEWER}, "versions": versions,
            "time": {version: "2026-12-01T00:00:00.000Z" for version in versions}}


def simple_index(pin: pins.Pin) -> str:
    wheel = pin.package.replace("-", "_")
    links = "".join(f'<a href="/files/{wheel}-{version}-py3-none-any.whl">{wheel}-{version}-py3-none-any.whl</a>\n'
                    for version in (pin.version, NEWER))
    return f"<!DOCTYPE html><html><body>\n{links}</body></html>"


class Registry(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = urllib.parse.unquote(self.path.split("?")[0]).rstrip("/")
        npm = {f"/{pin.package}": pin for pin in AGENT_PINS}
        pypi = {f"/simple/{pin.package}": pin for pin in pins.ENGINE_PINS}
        if path in npm:
            self.answer(json.dumps(npm_document(npm[path])), "application/json")
        elif path in pypi:
            self.answer(simple_index(pypi[path]), "text/html")
        else:
            self.send_error(404)

    def answer(self, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *arguments) -> None:
        pass


@pytest.fixture(scope="module")
def registry_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer((LOOPBACK, free_port()), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def doctor(registry: str, scratch) -> subprocess.CompletedProcess[str]:
    """`stable-prefix doctor` with npm and pip asking only `registry` (no cache, no other index, no local wheels)."""
    environment = {**os.environ, "npm_config_registry": f"{registry}/", "npm_config_cache": str(scratch / "npm-cache"),
                   "npm_config_prefer_online": "true", "PIP_INDEX_URL": f"{registry}/simple", "PIP_EXTRA_INDEX_URL": "",
                   "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}
    result = subprocess.run([str(VENV_BIN / "stable-prefix"), "doctor"], capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def online(registry_url, tmp_path_factory) -> str:
    """What the doctor printed, asking the test's registry."""
    return doctor(registry_url, tmp_path_factory.mktemp("doctor")).stdout


def cells(output: str, name: str) -> list[str]:
    """The row of the table that names `name`, cell by cell."""
    line = next(line for line in output.splitlines() if line.startswith(f"{name}  "))
    return re.split(r"\s{2,}", line)


def test_each_pinned_client_is_shown_against_the_registrys_newest_with_the_node_each_declares(online):
    for pin in AGENT_PINS:
        name, package, pinned, newest, node, verdict = cells(online, pin.name)
        assert (package, pinned, newest, node) == (pin.package, pin.version, NEWER, f">=20; {NODE_OF_NEWER}")
        assert verdict.startswith(f"{NEWER} is newer")


def test_the_installed_engine_is_named_tested_and_the_registrys_newest_shown(online):
    assert cells(online, "vllm-mlx")[1:4] == ["0.6.0", "0.3.0, 0.6.0", NEWER]
    assert cells(online, "mlx-lm")[1:4] == [pins.MLX_LM.version, pins.MLX_LM.version, NEWER]
    assert cells(online, "vllm-mlx")[5].startswith("tested;") and cells(online, "mlx-lm")[5].startswith("tested;")


def test_with_no_registry_reachable_every_row_says_so_and_no_version_is_made_up(tmp_path):
    output = doctor(f"http://{LOOPBACK}:{free_port()}", tmp_path).stdout  # nobody listens there
    for pin in AGENT_PINS:
        assert cells(output, pin.name)[2:] == [pin.version, "unknown", "unknown", "registry not reachable (ECONNREFUSED)"]
    for pin in pins.ENGINE_PINS:
        assert cells(output, pin.name)[3] == "registry not reachable (pip could not connect to its index)"


def test_the_engine_pins_are_what_the_makefile_requirements_and_pyproject_install():
    makefile, requirements, pyproject = ((REPO_ROOT / name).read_text() for name in ("Makefile", "requirements.txt", "pyproject.toml"))
    assert f"VLLM_MLX_VERSION := {pins.VLLM_MLX.version}\n" in makefile
    assert f"\nmlx-lm=={pins.MLX_LM.version}\n" in requirements
    assert f'"mlx-lm>={pins.MLX_LM.version},<0.32", "vllm-mlx=={pins.VLLM_MLX.version}"' in pyproject


def test_the_router_pins_are_what_the_makefile_installs():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"SMG_VERSION := {pins.SMG.version}\n" in makefile
    assert f"VLLM_ROUTER_VERSION := {pins.VLLM_ROUTER.version}\n" in makefile
