"""vllm-mlx: a config-file-driven LLM inference daemon on MLX."""

__version__ = "0.1.0"
