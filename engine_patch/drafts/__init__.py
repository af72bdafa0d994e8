"""Drafted decoding, engine-agnostic: drafts from the session's own tokens, the exact acceptance rule, the cost gate.

A decode step can feed a sequence's next token together with a guess of the
tokens after it (a draft) and keep the longest prefix of the guess the model
itself would have produced: several tokens for one forward pass, the same
answer. Here: where drafts come from (`suffix_proposer.py`: the request's own
prompt and reply so far and the other lanes the prefix cache holds), how a
draft is judged (`verification.py`), how long a draft each request gets from
its recent acceptance (`acceptance.py`), whether drafting pays on this machine
at all (`cost_gate.py`, from the verify-cost curve `verify_cost.py` measures),
and the per-request session both engines drive (`draft_session.py`). No engine
is imported here: the engines' drafted steps live beside their other seams
(vllm_mlx/simple/drafted_generation.py, vllm_mlx/batched/drafted_decode.py), and
the exact rollback of every cache layer after a draft cut short is in
cache/cache_layers.py.
"""
