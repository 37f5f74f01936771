"""heteroserve's CPU decode engine: GGUF llama-family models on the compiled kernels
(heteroserve_cpu), NUMA-pinned threads, a paged KV cache with continuous batching, and an
OpenAI-compatible server."""
