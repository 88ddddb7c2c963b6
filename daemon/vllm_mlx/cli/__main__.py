"""`python -m vllm_mlx.cli`: the `vllm-mlx` command (service units and tests start it so)."""

from vllm_mlx.cli.main import main

raise SystemExit(main())
