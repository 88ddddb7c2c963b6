"""Rerank and score: /v1/rerank and /v2/rerank (Jina's and Cohere's shapes) and /score
(vLLM's), over `task: rerank` models (docs/rerank.md)."""
