"""`bench.probes.decode_rows`: a batched decode step at each width, against that many single-row steps (figures, not a timed test)."""

from stable_prefix.bench.probes import decode_rows
from tests.support.models import require_model


def test_every_width_up_to_the_widest_gets_its_step_its_share_per_row_and_the_projection_alone(capsys):
    decode_rows.main(["--model", str(require_model()), "--context", "64", "--rows", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" row(s)")[0].rsplit(", ", 1)[1] for line in lines] == ["1", "2"]
    assert "step / (1 x one row's) 1.00x (35 paired steps)" in lines[0]  # the yardstick itself
    assert "ms per row, output projection alone" in lines[1] and "step / (2 x one row's)" in lines[1] and "[" in lines[1]
