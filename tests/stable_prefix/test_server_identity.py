"""`up --upstream URL` asks which server answers (stable_prefix/server_identity.py): each server recognised from where
it says who it is, against loopback stand-ins that answer as it does (tests/support/server_standins.py); anything else,
a server that is down or one that never answers, is unknown, quickly and without an error."""

import socket

import pytest

from stable_prefix import stack
from stable_prefix.server_identity import UNKNOWN, identify, with_proxy_settings_for
from stable_prefix.servers import free_port
from tests.support.server_standins import standin


@pytest.mark.parametrize(("standin_of", "name", "version"), [
    ("llama.cpp", "llama.cpp", "b11434-0a1b2c3"),
    ("vllm", "vllm", "0.32.0"),
    ("vllm-mlx-patched", "vllm-mlx", "0.6.0"),
    ("vllm-mlx", "vllm-mlx", None),
    ("lm-studio", "lm-studio", None),
    ("ollama", "ollama", "0.12.3"),
    ("sglang", "sglang", "0.5.2"),
])
def test_each_server_is_recognised_where_it_says_who_it_is(standin_of, name, version):
    with standin(standin_of) as url:
        found = identify(url)
    assert (found.name, found.version) == (name, version)
    assert found.patched == (standin_of == "vllm-mlx-patched")


def test_llama_cpp_says_how_many_slots_it_has():
    with standin("llama.cpp") as url:
        found = identify(url)
    assert found.slots == 4
    assert found.describe() == "llama.cpp's llama-server (version b11434-0a1b2c3, 4 slots, GET /props: build_info)"


def test_a_server_that_names_none_of_the_known_ones_is_unknown():
    with standin("unknown") as url:
        found = identify(url)
    assert found == UNKNOWN and not found.known
    assert "unknown server" in found.describe()


def test_a_trailing_slash_on_the_url_changes_nothing():
    with standin("ollama") as url:
        assert identify(url + "/").name == "ollama"


def test_nothing_listening_is_unknown_without_an_error():
    assert identify(f"http://127.0.0.1:{free_port()}") == UNKNOWN


def test_a_server_that_accepts_and_never_answers_is_unknown_after_the_timeout():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the kernel's backlog; nothing ever reads or answers them
        assert identify(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5) == UNKNOWN


def test_before_llama_cpp_the_proxy_pins_lanes_to_the_slots_it_reported_without_slot_files_and_the_users_set_still_wins():
    options = stack.parse_options(["--upstream", "http://127.0.0.1:9", "m", "--set", "llama_slots=0"])
    with standin("llama.cpp") as url:
        told = with_proxy_settings_for(identify(url), options)
    assert told.proxy_options[:2] == ("llama_slots=4", "llama_slot_files=false") and told.proxy_options[-1] == "llama_slots=0"
    assert told.proxy_options[2:] == options.proxy_options


@pytest.mark.parametrize("standin_of", ["unknown", "ollama", "vllm-mlx-patched"])
def test_before_any_other_server_the_proxy_runs_as_before(standin_of):
    options = stack.parse_options(["--upstream", "http://127.0.0.1:9", "m"])
    with standin(standin_of) as url:
        assert with_proxy_settings_for(identify(url), options).proxy_options == options.proxy_options
