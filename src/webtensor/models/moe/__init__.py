"""The mixture-of-experts family: Qwen3-MoE (`qwen3_moe`), Mixtral (`mixtral`) and OLMoE (`olmoe`) — Llama-lineage
decoders whose MLP is a router over E experts, each row through its top k (`ops.moe_route`, `ops.expert_linear`).
Its config (`config.py`), tensor map (`names.py`) and forward over ops (`forward.py`); `family.py` registers it."""
