"""The builtin prefill engine (`heteroserve-prefill-engine`): the llama family (Llama, Qwen2,
SmolLM2) in PyTorch on any torch device, from the same GGUF file as the CPU engine.

- `devices`: a device string -> torch device, its plugin (hpu, npu) and default dtype;
- `weights`: GGUF tensors -> dequantized torch tensors on the device;
- `model`: the forward pass over a batch of sequences, K/V in a preallocated token pool;
- `kv_pool`: that pool's blocks and the KV budget in tokens;
- `sampling`: greedy, temperature, top-k, top-p with per-sequence seeded generators;
- `sequence`: one request's tokens, detokenized text and stop handling;
- `engine`: the scheduler (waiting and running queues, batched prefill, decode steps,
  preemption) and the KV kept for export;
- `kv_export`: a finished prefill's prompt KV under a `kv_handoff` handle (the hand-off);
- `serving`: OpenAI requests -> engine -> OpenAI responses (no HTTP);
- `metrics`, `server`, `__main__`: Prometheus metrics, the Starlette routes, the CLI.
"""
