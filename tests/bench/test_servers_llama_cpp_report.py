"""bench/servers_llama_cpp.py's table, from figures written here (the run itself needs llama-server: `python -m
stable_prefix.bench.servers_llama_cpp`)."""

from stable_prefix.bench.servers_llama_cpp import SEQUENCE, markdown


def rows(prefilled: int) -> list[tuple[str, int, int]]:
    return [(f"lane{index}", 100, prefilled) for index in range(len(SEQUENCE))]


def test_each_configuration_is_a_row_with_its_tokens_prefilled_against_straight():
    table = markdown("m.gguf", 0.05, {2: {"straight, as a user runs it": rows(60), "through the proxy": rows(30)}}, "cmd")
    straight, proxy = (line for line in table.splitlines() if line.startswith("| 2 |"))
    assert f"| {60 * len(SEQUENCE):,} | {100 * len(SEQUENCE):,} | 1.00x |" in straight
    assert f"| {30 * len(SEQUENCE):,} | {100 * len(SEQUENCE):,} | 0.50x |" in proxy
    assert "| 70 of 100 reused |" in proxy
