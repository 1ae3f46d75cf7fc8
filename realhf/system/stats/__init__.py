"""Where the numbers go: metrics.jsonl, TensorBoard, W&B, Prometheus, the curves and completion logs."""
