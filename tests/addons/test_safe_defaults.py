"""Safe by default: a warning when the proxy listens beyond loopback, private capture files, captures under the
working directory."""

import json
import logging
import stat

import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons import exposure
from stable_prefix.addons.capture import Capture
from tests.fixtures import claude_code
from tests.support.processes import LOOPBACK, free_port, mitmdump_command, running
from tests.support.proxy_addons import DiagnosedCapture, ProxyAddons

WARNING = "listening beyond this machine"


@pytest.fixture(autouse=True)
def fresh_warning(monkeypatch):
    monkeypatch.setattr(exposure, "_warned", False)


def start_addon(addon, caplog, **options):
    caplog.set_level(logging.WARNING)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, **options)
        addon.running()
    return caplog.text


@pytest.mark.parametrize("addon_class", [ProxyAddons, Capture])
def test_listening_on_every_interface_is_warned_about(addon_class, caplog, tmp_path):
    text = start_addon(addon_class(), caplog, listen_host="", mode=["reverse:http://127.0.0.1:8000"])
    assert WARNING in text
    assert "on every interface" in text and "--listen-host 127.0.0.1" in text and "expose_proxy=true" in text


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "my-laptop.local"])
def test_a_non_loopback_listen_host_is_warned_about(host, caplog):
    assert f"on {host}" in start_addon(ProxyAddons(), caplog, listen_host=host, mode=["reverse:http://127.0.0.1:8000"])


def test_a_listen_address_in_the_mode_spec_counts(caplog):
    text = start_addon(ProxyAddons(), caplog, listen_host="127.0.0.1", mode=["reverse:http://127.0.0.1:8000@0.0.0.0:8080"])
    assert WARNING in text and "on 0.0.0.0" in text


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_listen_hosts_are_not_warned_about(host, caplog):
    assert WARNING not in start_addon(ProxyAddons(), caplog, listen_host=host, mode=["reverse:http://127.0.0.1:8000"])


def test_the_option_says_the_exposure_is_intended(caplog):
    assert WARNING not in start_addon(ProxyAddons(), caplog, listen_host="0.0.0.0", expose_proxy=True)


def test_two_scripts_warn_once(caplog):
    caplog.set_level(logging.WARNING)
    addons = [ProxyAddons(), Capture()]
    with taddons.context(*addons) as tctx:
        tctx.options.update(listen_host="0.0.0.0")
        for addon in addons:
            addon.running()
    assert caplog.text.count(WARNING) == 1


@pytest.mark.server
def test_mitmdump_on_loopback_with_both_scripts_starts_without_the_warning(tmp_path):
    port = free_port()
    command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], f"http://{LOOPBACK}:9", port,
                               {"capture_dir": tmp_path / "captures"})
    with running("proxy", command, port=port, log_dir=tmp_path) as proxy:
        pass
    log = proxy.log_text()
    assert "Loading script" in log and f"listening at {LOOPBACK}:{port}" in log
    assert WARNING not in log


# --- capture files ------------------------------------------------------------------------------------


def captured_one_request(addon):
    flow = tflow.tflow(req=tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=b"/v1/messages",
                                       headers=http.Headers(((b"content-type", b"application/json"),)),
                                       content=json.dumps(claude_code.main_request()).encode()))
    addon.request(flow)
    flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"application/json"),)), content=b"{}")
    addon.response(flow)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_capture_files_are_private_and_their_new_folders_too(tmp_path):
    root = tmp_path / "new" / "captures"
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_dir=str(root), capture_session="s1")
        captured_one_request(addon)
    [record] = (root / "s1").glob("*.json")
    assert mode(record) == 0o600
    assert mode(root / "s1") == mode(root) == mode(tmp_path / "new") == 0o700


def test_an_existing_capture_folder_keeps_its_mode_and_the_session_folder_is_private(tmp_path):
    tmp_path.chmod(0o755)
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_dir=str(tmp_path), capture_session="s1")
        captured_one_request(addon)
    assert mode(tmp_path) == 0o755 and mode(tmp_path / "s1") == 0o700


def test_the_default_capture_folder_is_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    addon = DiagnosedCapture()  # the record is named by the lane the diagnosis gives it
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_session="s1")
        captured_one_request(addon)
    [record] = (tmp_path / "captures" / "sessions" / "s1").glob("*.json")
    assert record.name == "0001-main.json"
