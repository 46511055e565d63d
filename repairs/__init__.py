"""Where this repo mends TRL 1.16 and transformers 5.17: their multi-turn rollout restated for evaluation and the token
budget (`rollout`), tool rounds every process enters (`tool_rounds`), one placeholder per image for vLLM
(`vllm_images`), and an exact resume (`resume`). Each reach into a library's internals is listed in docs/internals.md.
"""
