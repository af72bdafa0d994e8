"""A team's routers (smg, HAProxy, vllm-router) before several engines, and the key our proxy gives them."""
